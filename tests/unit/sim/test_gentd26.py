"""The GenTD26 importer (real adapter-serving traffic → simulator trace) and trace refusals."""

from __future__ import annotations

import gzip
import itertools
from pathlib import Path

import pytest
from typer.testing import CliRunner

from loraplane.cli.main import app
from loraplane.policy.model import RequestClass
from loraplane.sim.gentd26 import Gentd26Error, import_gentd26, keyed_unit
from loraplane.sim.trace import format_rows, read_trace

SOURCE = Path(__file__).resolve().parents[2] / "data/traces/gentd26/lora_request_trace.csv.gz"
HEADER = ("gmt_create,predict_type,predict_status,exec_time_seconds,groupId,prompt_length,"
          "negative_prompt_length,num_images_per_prompt,num_inference_steps,"
          "checkpoint_model_version_id,num_lora\n")


def test_the_checked_in_trace_maps_to_one_unit_per_group_and_checkpoint() -> None:
    rows = list(import_gentd26(SOURCE))
    assert len(rows) == 26_823
    assert len({r.adapter_id for r in rows}) == 8_300
    assert rows[0].ts == 0.0 and all(a.ts <= b.ts for a, b in itertools.pairwise(rows))
    # one unit = one size, rank, tenant and priority throughout
    seen: dict[str, tuple[object, ...]] = {}
    for r in rows:
        attrs = (r.size_bytes, r.rank, r.tenant_id, r.priority)
        assert seen.setdefault(r.adapter_id, attrs) == attrs
        assert r.adapter_id.startswith(r.tenant_id + "/")
        assert r.canary == (r.request_class is RequestClass.CANARY)
    classes = {r.request_class for r in rows}
    assert classes == set(RequestClass)


def test_same_input_and_key_give_the_same_bytes_and_a_key_changes_the_draw() -> None:
    a = "".join(format_rows(import_gentd26(SOURCE)))
    b = "".join(format_rows(import_gentd26(SOURCE)))
    assert a == b
    other = "".join(format_rows(import_gentd26(SOURCE, key="another")))
    assert other != a
    assert keyed_unit("k", "tier", "G1") == keyed_unit("k", "tier", "G1")


def test_time_scale_changes_only_the_times() -> None:
    real = list(import_gentd26(SOURCE))
    fast = list(import_gentd26(SOURCE, time_scale=24.0))
    assert len(real) == len(fast)
    for r, f in zip(real, fast, strict=True):
        assert f.ts == pytest.approx(r.ts / 24.0)
        assert (r.adapter_id, r.priority, r.request_class, r.size_bytes, r.canary) == (
            f.adapter_id, f.priority, f.request_class, f.size_bytes, f.canary
        )


def _gz(tmp_path: Path, body: str) -> Path:
    p = tmp_path / "g.csv.gz"
    p.write_bytes(gzip.compress((HEADER + body).encode()))
    return p


def test_bad_rows_are_refused_naming_row_and_column(tmp_path: Path) -> None:
    good = "2024-11-15 16:57:50,TXT_2_IMG,SUCCEED,32.0,G0,63.0,26.0,1.0,30.0,M0,0\n"
    bad_time = _gz(tmp_path, good + "yesterday,TXT_2_IMG,SUCCEED,3,G0,6,2,1,30,M0,0\n")
    with pytest.raises(Gentd26Error, match="row 3, column gmt_create"):
        list(import_gentd26(bad_time))
    bad_steps = _gz(tmp_path, good.replace(",30.0,M0", ",thirty,M0"))
    with pytest.raises(Gentd26Error, match="row 2, column num_inference_steps"):
        list(import_gentd26(bad_steps))
    backwards = _gz(tmp_path, good + good.replace("16:57:50", "16:00:00"))
    with pytest.raises(Gentd26Error, match="row 3, column gmt_create"):
        list(import_gentd26(backwards))


def test_cli_imports_and_sim_refuses_a_broken_trace(tmp_path: Path) -> None:
    out = tmp_path / "g.csv.gz"
    runner = CliRunner()
    res = runner.invoke(app, ["trace", "import", "gentd26", "--out", str(out), "--input",
                              str(SOURCE), "--time-scale", "24"])
    assert res.exit_code == 0, res.output
    assert "26823 requests, 8300 versions" in res.output
    trace = read_trace(out)
    assert trace.n_versions == 8_300 and trace.ts[-1] < 23 * 86_400 / 24 + 86_400 / 24
    broken = tmp_path / "broken.csv"
    broken.write_text(
        "ts,tenant_id,adapter_id,priority,request_class,rank,size_bytes,canary,prompt_tokens,"
        "output_tokens\n1,t,t/a@1,gold,interactive,8,100,0,10,10\n2,t,t/a@1,gold,interactive,8,"
        "big,0,10,10\n"
    )
    res = runner.invoke(app, ["sim", "--trace", str(broken), "--gpu-slots", "2",
                              "--host-bytes", "1GB"])
    assert res.exit_code == 2
    assert "line 3: column size_bytes: not int: 'big'" in res.output
    res = runner.invoke(app, ["trace", "import", "azure", "--out", str(out)])
    assert res.exit_code != 0
