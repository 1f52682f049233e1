"""bench.micro_batch refuses sizes it cannot compare, in one line, before it loads anything."""

from __future__ import annotations

import pytest

from bench.micro_batch import main


@pytest.mark.parametrize(
    ("sizes", "said"),
    [("1,x", "as integers"), ("2", "at least two sizes"), ("0,2", "each at least 1")],
)
def test_bad_sizes_are_one_line_naming_what_to_give(sizes, said, capsys, tmp_path):
    out = tmp_path / "mb.json"
    with pytest.raises(SystemExit) as stopped:
        main(["--sizes", sizes, "--out", str(out)])
    assert stopped.value.code == 2
    assert said in capsys.readouterr().err
    assert not out.exists()
