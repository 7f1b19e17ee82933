"""Docs that cannot rot: every shell, Python and Dockerfile block of README.md and docs/*.md is
run as written, or, where it needs AWS, a GPU or is CI's own command, checked
(tests/docs/doc_blocks.py has the convention). One test per block, id `<file>:<line>`.

Below them, self-tests of the extraction and the checks on small in-memory markdown.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import IMAGE
from tests.docs import doc_blocks as db

BLOCKS = db.collect()


def block_param(block: db.Block):
    marks = [pytest.mark.docker] if db.needs_docker(block) else []
    return pytest.param(block, id=block.where, marks=marks)


@pytest.mark.parametrize("block", [block_param(b) for b in BLOCKS])
def test_doc_block(block: db.Block, request, tmp_path):
    if db.needs_docker(block):
        image = request.getfixturevalue("image")  # builds the stand-in and the image once
        client = request.getfixturevalue("docker_client")
        problems = db.verify(block, tmp_path, image, docker_client=client)
    else:
        problems = db.verify(block, tmp_path, IMAGE)
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------------------- self-tests
def blocks_of(markdown: str) -> list[db.Block]:
    return db.extract(markdown, "doc.md")


def only(markdown: str) -> db.Block:
    (block,) = blocks_of(markdown)
    return block


def test_extract_reads_markers_and_ignores_text_blocks():
    markdown = """# t
```text
make anything
```

```json
{"a": 1}
```

```
no language
```

<!-- doc: run in=examples timeout=30 -->
```bash
echo one
```

- a list item:

  <!-- doc: check aws — needs credentials -->
  ```python
  import os
  print(os.sep)
  ```
"""
    run, check = blocks_of(markdown)
    assert (run.where, run.lang, run.code, run.problem) == ("doc.md:15", "bash", "echo one\n", None)
    assert run.marker == db.Marker("run", directory="examples", timeout=30)
    assert check.where == "doc.md:22"
    assert check.code == "import os\nprint(os.sep)\n"  # dedented
    assert check.marker == db.Marker("check", scope="aws", reason="needs credentials")


@pytest.mark.parametrize(
    ("markdown", "expected"),
    [
        ("text\n```bash\nls\n```\n", "doc.md:2: bash block without a marker"),
        ("<!-- doc: run -->\n\n```bash\nls\n```\n", "doc.md:1: doc marker not followed"),
        ("<!-- doc: skip -->\n```python\npass\n```\n", "doc.md:2: unknown marker 'skip'"),
        ("<!-- doc: check aws -->\n```sh\nls\n```\n", "doc.md:2: unknown marker"),
        ("<!-- doc: check cloud — x -->\n```sh\nls\n```\n", "doc.md:2: unknown marker"),
        ("<!-- doc: run wait=1 -->\n```sh\nls\n```\n", "doc.md:2: run takes in="),
        ("<!-- doc: run -->\n```text\nls\n```\n", "doc.md:2: doc marker on a text block"),
        ("<!-- doc: run -->\n```dockerfile\nFROM x\n", "doc.md:2: fence never closed"),
    ],
)
def test_convention_breaks_are_failures_with_their_location(markdown, expected, tmp_path):
    problems = [b.problem for b in blocks_of(markdown) if b.problem]
    assert problems and problems[0].startswith(expected), problems
    assert db.verify(blocks_of(markdown)[0], tmp_path, IMAGE) == [problems[0]]


def test_substitutions_apply_to_the_image_role_and_s3_only(tmp_path):
    code = (
        'image_uri="123456789012.dkr.ecr.us-east-1.amazonaws.com/container-entry@sha256:<digest>"\n'
        "<account>.dkr.ecr.<region>.amazonaws.com/container-entry:1.2.3 x\n"
        "FROM 123456789012.dkr.ecr.us-east-1.amazonaws.com/container-entry\n"
        "docker run container-entry:latest\n"
        'role="arn:aws:iam::123456789012:role/SageMakerExecutionRole"\n'
        "arn:aws:iam::<account>:role/<name>\n"
        "s3://my-bucket/data/train/ s3://<bucket>/code/sourcedir.tar.gz\n"
        "container-entry/dlc-standin:latest\n"
        "763104351884.dkr.ecr.us-east-1.amazonaws.com/huggingface-pytorch-training:2.9.0-gpu\n"
    )
    out, directories = db.substitute(code, "container-entry:test", tmp_path)
    assert out.splitlines() == [
        'image_uri="container-entry:test"',
        "container-entry:test x",
        "FROM container-entry:test",
        "docker run container-entry:test",
        f'role="{db.FAKE_ROLE}"',
        db.FAKE_ROLE,
        f"file://{tmp_path}/my-bucket/data/train/ file://{tmp_path}/bucket/code/sourcedir.tar.gz",
        "container-entry/dlc-standin:latest",
        "763104351884.dkr.ecr.us-east-1.amazonaws.com/huggingface-pytorch-training:2.9.0-gpu",
    ]
    assert directories == [tmp_path / "my-bucket" / "data" / "train", tmp_path / "bucket" / "code"]


def test_shell_check_catches_syntax_errors_and_unknown_make_targets(tmp_path):
    broken = only("<!-- doc: check aws — x -->\n```bash\nmake build IMAGE=<tag>\n```\n")
    (problem,) = db.verify(broken, tmp_path, IMAGE)
    assert problem.startswith("doc.md:2: bash -n:") and "syntax error" in problem
    unknown = only(
        "<!-- doc: check gpu — x -->\n```sh\nexport A=1\nmake lint no-such-target\n```\n"
    )
    (problem,) = db.verify(unknown, tmp_path, IMAGE)
    assert "`make no-such-target` names no target" in problem
    fine = (
        "<!-- doc: check aws - x -->\n```shell\n"
        "export AWS_REGION=x  # c\nmake push REGISTRY=r:5000\n```\n"
    )
    assert db.verify(only(fine), tmp_path, IMAGE) == []


def test_make_calls_are_parsed_from_shell():
    code = "cd x && make -C sub -j 4 build IMAGE=a \\\n  B='c d'; echo make\nsudo true | make\n"
    assert db.make_calls(code) == [
        db.MakeCall(("build",), ("IMAGE=a", "B=c d"), "sub"),
        db.MakeCall((), (), None),
    ]


def test_check_ci_requires_exactly_the_ci_command(tmp_path):
    ci = tmp_path / "run"
    ci.write_text('#!/bin/bash\nset -e\nmake lint\nmake test PYTEST_ARGS="-rfEs"\n')
    block = only("<!-- doc: check ci — the suite itself -->\n```bash\nmake test\n```\n")
    assert db.check_ci(block, block.code, ci) == []
    other = only("<!-- doc: check ci — x -->\n```bash\nmake unit\n```\n")
    (problem,) = db.check_ci(other, other.code, ci)
    assert "`make unit` is not what run runs (make lint; make test PYTEST_ARGS=-rfEs)" in problem
    assert db.check_ci(block, block.code, tmp_path / "missing")[-1].endswith("does not exist")


def test_the_real_ci_script_runs_make_test():
    block = only("<!-- doc: check ci — x -->\n```bash\nmake test\n```\n")
    assert db.check_ci(block, block.code) == []


def test_dockerfile_check_wants_our_image_and_no_hadolint_error(tmp_path):
    good = (
        "<!-- doc: check aws — x -->\n```dockerfile\n"
        "FROM 123456789012.dkr.ecr.us-east-1.amazonaws.com/container-entry@sha256:<digest>\n"
        "COPY src/ /opt/ml/code/\nENV SAGEMAKER_PROGRAM=train.py\n```\n"
    )
    assert db.verify(only(good), tmp_path, IMAGE) == []
    bad = "<!-- doc: check aws — x -->\n```dockerfile\nFROM python:3.12\nCOPY a b c\n```\n"
    problems = db.verify(only(bad), tmp_path, IMAGE)
    assert "the final FROM (python:3.12) is not our image" in problems[0]
    assert "DL3021" in problems[1]


def test_run_blocks_run_in_a_copy_with_the_repo_at_hand(tmp_path):
    markdown = (
        "<!-- doc: run in=examples timeout=60 -->\n```bash\n"
        'test -f hf_trainer_tiny.py && touch new && test "$REPO" = ' + str(db.REPO) + "\n"
        'command -v ruff >/dev/null\nmake -C "$REPO" -n help >/dev/null\n```\n'
    )
    assert db.verify(only(markdown), tmp_path / "a", IMAGE) == []
    assert not (db.REPO / "examples" / "new").exists()
    python = (
        "<!-- doc: run -->\n```python\nimport os, container_entry\nassert not os.listdir()\n```\n"
    )
    assert db.verify(only(python), tmp_path / "b", IMAGE) == []


def test_failing_and_hanging_run_blocks_fail_with_their_location(tmp_path):
    failing = only("intro\n<!-- doc: run -->\n```sh\necho about to fail\nexit 3\n```\n")
    (problem,) = db.verify(failing, tmp_path / "a", IMAGE)
    assert problem.startswith("doc.md:3: sh block exited 3") and "about to fail" in problem
    hanging = only("<!-- doc: run timeout=1 -->\n```bash\nsleep 30\n```\n")
    (problem,) = db.verify(hanging, tmp_path / "b", IMAGE)
    assert problem.startswith("doc.md:2: bash block timed out after 1 s")
    unset = only("<!-- doc: run -->\n```bash\necho $NOT_SET_ANYWHERE\n```\n")
    assert "unbound variable" in db.verify(unset, tmp_path / "c", IMAGE)[0]
    suite = only("<!-- doc: run -->\n```bash\nmake test\n```\n")
    assert "must not start the test suite" in db.verify(suite, tmp_path / "d", IMAGE)[0]
    outside = only("<!-- doc: run in=../.. -->\n```bash\ntrue\n```\n")
    assert "not a directory of the repository" in db.verify(outside, tmp_path / "e", IMAGE)[0]


def test_python_blocks_pick_their_venv():
    assert db.sdk_flavor("from sagemaker.estimator import Estimator\n") == "v2"
    assert db.sdk_flavor("import sagemaker.local\n") == "v2"
    assert db.sdk_flavor("from sagemaker.train.configs import Compute\nimport sagemaker\n") == "v3"
    assert db.sdk_flavor("from sagemaker.core.helper import x\n") == "v3"
    assert db.sdk_flavor("import sagemaker_training, torch\n") is None


def test_python_check_compiles_and_resolves_imports(tmp_path):
    syntax = only("<!-- doc: check gpu — x -->\n```python\nimport os\nif True print(os)\n```\n")
    (problem,) = db.verify(syntax, tmp_path, IMAGE)
    assert problem.startswith("doc.md:4:")
    missing = only("<!-- doc: check gpu — x -->\n```python\nimport no_such_module_here\n```\n")
    (problem,) = db.verify(missing, tmp_path, IMAGE)
    assert problem.startswith("doc.md:3: import no_such_module_here fails: ModuleNotFoundError")


SDK_V2 = """\
<!-- doc: check aws — a real job -->
```python
from sagemaker.estimator import Estimator

estimator = Estimator(
    image_uri="123456789012.dkr.ecr.us-east-1.amazonaws.com/container-entry@sha256:<digest>",
    role="arn:aws:iam::123456789012:role/SageMakerExecutionRole",
    instance_type="ml.g5.12xlarge",
    instance_count=2,
    entry_point="train.py",
    source_dir="src",
    hyperparameters={"epochs": 3},
)
estimator.fit({"train": "s3://my-bucket/data/train"})
```
"""

SDK_V3 = """\
<!-- doc: check aws — a real job -->
```python
from sagemaker.train import ModelTrainer
from sagemaker.train.configs import Compute, InputData
from sagemaker.train.model_trainer import Mode

trainer = ModelTrainer(
    training_image="container-entry:latest",
    training_mode=Mode.LOCAL_CONTAINER,
    compute=Compute(instance_type="ml.g5.12xlarge", instance_count=2),
    environment={"SAGEMAKER_PROGRAM": "train.py"},
)
trainer.train(input_data_config=[InputData(channel_name="code", data_source="s3://b/code/")])
```
"""


TYPOS = [  # (block, replace what, by what, the problem it must cause)
    (SDK_V2, "instance_count=2", "instance_count=2, image_urii='x'", "'image_urii'"),
    (SDK_V2, 'image_uri="', 'image_urii="', "missing a required argument: 'image_uri'"),
    (SDK_V2, "fit({", "fit(wiat=True, inputs={", "unexpected keyword argument 'wiat'"),
    (SDK_V2, "estimator.fit(", "estimator.fitt(", "Estimator has no method 'fitt'"),
    (SDK_V3, "instance_count=2", "instance_cnt=2", "keyword argument 'instance_cnt'"),
    (SDK_V3, "LOCAL_CONTAINER", "LOCAL_CONTAINR", "has no attribute 'LOCAL_CONTAINR'"),
    (SDK_V3, "input_data_config=", "inputs=", "unexpected keyword argument 'inputs'"),
    (SDK_V3, "Compute, InputData", "Compute, Input", "cannot import Input from"),
]


@pytest.mark.parametrize("flavor", ["v2", "v3"])
def test_sdk_calls_are_checked_against_the_installed_sdk(flavor, tmp_path):
    markdown = SDK_V2 if flavor == "v2" else SDK_V3
    good = only(markdown)
    assert db.sdk_flavor(good.code) == flavor
    typos = [typo for typo in TYPOS if typo[0] == markdown]
    blocks = [good] + [only(md.replace(old, new, 1)) for md, old, new, _ in typos]
    image = "container-entry:test"
    checked = [(block, db.substitute(block.code, image, tmp_path)[0]) for block in blocks]
    assert db.verify(good, tmp_path, IMAGE) == []  # the way test_doc_block checks it
    found = db.check_python_blocks(checked, db.python_for(flavor))
    assert found[0] == []
    for problems, (_, old, new, expected) in zip(found[1:], typos, strict=True):
        assert len(problems) == 1 and expected in problems[0], (old, new, problems)
        assert problems[0].startswith("doc.md:"), problems


def test_every_doc_file_is_collected():
    files = {block.file for block in BLOCKS}
    texts = {str(p.relative_to(db.REPO)): p.read_text() for p in db.doc_files()}
    assert "README.md" in texts
    for name, text in texts.items():
        if any(f"```{lang}" in text for lang in db.EXECUTABLE):
            assert name in files
    assert all(isinstance(block.line, int) for block in BLOCKS)
    assert Path(db.REPO / "tests" / "docs" / "sdk_check.py").exists()
