"""``Stack.wipe`` deletes only the stack's own data directory: one a ``LORAPLANE_STACK_DATA_DIR``
pointed at a folder the stack never made (a home, a checkout) is refused, naming it, and
left as it was. No component is running here: ``down`` finds nothing to stop."""

from __future__ import annotations

from pathlib import Path

import pytest

from loraplane.stack.settings import StackSettings
from loraplane.stack.stack import MARKER, Stack, StackError


def stack_at(path: Path) -> Stack:
    return Stack(StackSettings(profile="test", port_base=26500, data_dir=path))


def test_a_folder_the_stack_never_made_is_refused_and_kept(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "notes.txt").write_text("mine")
    (home / "logs").mkdir()  # one of the stack's folders is not enough
    with pytest.raises(StackError, match=rf"refusing to wipe {home}.*no {MARKER}"):
        stack_at(home).wipe()
    assert (home / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("layout", ["marker", "old stack", "empty", "missing"])
def test_the_stacks_own_directory_is_deleted(tmp_path: Path, layout: str) -> None:
    data = tmp_path / "stack"
    if layout == "marker":
        data.mkdir()
        (data / MARKER).write_text("")
        (data / "seaweedfs").mkdir()
    elif layout == "old stack":  # written before the marker existed
        for sub in ("logs", "run", "postgres"):
            (data / sub).mkdir(parents=True)
    elif layout == "empty":
        data.mkdir()
    st = stack_at(data)
    st.wipe()
    assert not data.exists()
    assert not st.postgres.dir.exists()
