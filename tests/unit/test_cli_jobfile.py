"""Reading job files: OpenPAI's commented JSON, YAML, and clear errors."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from pai_cli.jobfile import JobFileError, apply_overrides, parse_job_config, read_source

COMMENTED = """// from OpenPAI's docs
{
  "jobName": "tf-dist", // the job's name
  /* a block
     comment */
  "image": "x",
  "dataDir": "http://keep//this"
}
"""


def test_comments_are_stripped_but_not_inside_strings() -> None:
    assert parse_job_config("job.json", COMMENTED) == {
        "jobName": "tf-dist", "image": "x", "dataDir": "http://keep//this"}


def test_a_json_error_points_at_the_line_despite_block_comments() -> None:
    text = '{\n /* one\n two */\n "a": 1\n "b": 2\n}'
    with pytest.raises(JobFileError, match=r"^job.json:5:2: invalid JSON: Expecting ','"):
        parse_job_config("job.json", text)


@pytest.mark.parametrize("name", ["job.yaml", "job.YML"])
def test_yaml_by_extension(name: str) -> None:
    assert parse_job_config(name, "jobName: a\ntaskRoles: []\n") == {"jobName": "a",
                                                                     "taskRoles": []}


def test_yaml_from_stdin_when_it_is_not_json() -> None:
    assert parse_job_config("<stdin>", "jobName: a\n") == {"jobName": "a"}


@pytest.mark.parametrize(("name", "text", "message"), [
    pytest.param("j.json", "[1]", "a job config is an object \\(got list\\)", id="a list"),
    pytest.param("j.json", "", "^j.json holds no job config$", id="empty"),
    pytest.param("j.yaml", "", "a job config is an object \\(got nothing\\)",
                 id="empty YAML"),
    pytest.param("j.yaml", "a: [", "^j.yaml:1:5: invalid YAML: expected the node content",
                 id="broken YAML"),
    pytest.param("j.json", "// only a comment\n", "holds no job config", id="only a comment"),
])
def test_bad_files(name: str, text: str, message: str) -> None:
    with pytest.raises(JobFileError, match=message):
        parse_job_config(name, text)


def test_read_source(tmp_path: Path) -> None:
    path = tmp_path / "job.json"
    path.write_text("{}")
    assert read_source(str(path), io.StringIO("no")) == (str(path), "{}")
    assert read_source("-", io.StringIO("{ }")) == ("<stdin>", "{ }")
    with pytest.raises(JobFileError, match=r"cannot read .*nope\.json: No such file"):
        read_source(str(tmp_path / "nope.json"), io.StringIO())


def test_overrides_leave_the_original_alone() -> None:
    config = {"jobName": "a"}
    assert apply_overrides(config, name="b", vc="research") == {
        "jobName": "b", "virtualCluster": "research"}
    assert apply_overrides(config, name=None, vc=None) == {"jobName": "a"}
    assert config == {"jobName": "a"}


def test_overrides_of_a_v2_file_use_v2_fields() -> None:
    config = {"protocolVersion": 2, "name": "a", "defaults": {"deployment": "d"}}
    assert apply_overrides(config, name="b", vc="research") == {
        "protocolVersion": 2, "name": "b",
        "defaults": {"deployment": "d", "virtualCluster": "research"}}
    assert config["defaults"] == {"deployment": "d"}


def test_the_v2_examples_parse() -> None:
    from pathlib import Path
    examples = Path(__file__).resolve().parents[2] / "examples"
    for path in sorted(examples.glob("v2-*.yaml")):
        config = parse_job_config(path.name, path.read_text())
        assert config["protocolVersion"] == 2, path
