"""The admission benchmark runs end to end on a small shape and writes its JSON."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import admission as bench


def test_bench_small_shape(tmp_path: Path) -> None:
    out = tmp_path / "admission.json"
    rc = bench.main(["--layers", "2", "--rank", "4", "--repeat", "2", "--no-fail",
                     "--out", str(out), "--cache-dir", str(tmp_path / "cache")])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["verify_mb_s"] > 0 and doc["sha256_mb_s"] > 0
    assert abs(doc["ratio"] - doc["verify_mb_s"] / doc["sha256_mb_s"]) < 0.01
    assert doc["adapter"]["tensors"] == 2 * 7 * 2
    assert set(doc["stage_median_s"]) >= {"signature", "safetensors", "tensors", "finite"}
    # the cached adapter is reused by the next run
    assert bench.main(["--layers", "2", "--rank", "4", "--repeat", "1", "--no-fail",
                       "--out", str(out), "--cache-dir", str(tmp_path / "cache")]) == 0
