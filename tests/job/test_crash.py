"""A rank's crash record names what the user's code raised and the user's own line, not the
frames of Python, the libraries or slurmddp that the exception passed through."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from dist_envs import dist_env

from slurmddp.job import crash
from slurmddp.job.records import AttemptId, CodeSite, Failure

USER_CODE = """\
import json

from omegaconf import OmegaConf


def main(config):
    return helper(config)


def helper(config):
    json.loads("{}")
    return config.lrr
"""


def raised_by_user_code(tmp_path: Path) -> BaseException:
    """What `main` of a file in tmp_path raises: omegaconf's error about a key it lacks."""
    source = tmp_path / "train.py"
    source.write_text(USER_CODE)
    spec = importlib.util.spec_from_file_location("train_for_crash_test", source)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    from omegaconf import OmegaConf

    with pytest.raises(Exception) as caught:
        module.main(OmegaConf.create({"lr": 0.1}))
    return caught.value


def test_the_users_innermost_frame_is_named_not_the_librarys(tmp_path: Path) -> None:
    exc = raised_by_user_code(tmp_path)
    assert crash.users_frame(exc) == CodeSite(str(tmp_path / "train.py"), 12, "helper")


def test_frames_of_the_standard_library_are_passed_over() -> None:
    with pytest.raises(ValueError) as caught:
        json.loads("{")  # raised two frames down, in json/decoder.py
    where = crash.users_frame(caught.value)
    assert where is not None
    assert (where.file, where.function) == (__file__, "test_frames_of_the_standard_library_are_passed_over")


def test_the_record_keeps_the_error_text_and_adds_type_message_and_line(tmp_path: Path) -> None:
    exc = raised_by_user_code(tmp_path)
    crash.record(tmp_path, dist_env(rank=3, job_id="41"), 7, repr(exc), exc)
    failure = Failure.read_for(tmp_path, AttemptId("41", 0))
    assert failure is not None
    assert failure.error == repr(exc)
    assert (failure.rank, failure.step, failure.exception) == (3, 7, "ConfigAttributeError")
    assert failure.message is not None and failure.message.startswith("Missing key lrr")
    assert failure.where == CodeSite(str(tmp_path / "train.py"), 12, "helper")
