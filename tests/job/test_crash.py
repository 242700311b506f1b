"""A rank's crash record names what the user's code raised and the user's own line, not the
frames of Python, the libraries or slurmddp that the exception passed through."""

from __future__ import annotations

import importlib.util
import json
import socket
from pathlib import Path

import pytest
from dist_envs import dist_env

from slurmddp.job.process import crash
from slurmddp.rundir.records import AttemptId, CodeSite, Failure

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


# A node is blamed on its device's evidence, never on the words of an error: a host blamed is left
# out of the run for good (job/allocation/requeue.py).

NVML_ASSERT = RuntimeError(
    'NVML_SUCCESS == r INTERNAL ASSERT FAILED at "/pytorch/c10/cuda/CUDACachingAllocator.cpp":838, '
    "please report a bug to PyTorch. "
)
"""What torch's caching allocator raises when its own NVML call fails: a software error, whose
words name NVML and CUDA."""


def accelerator_error(code: int, text: str) -> BaseException:
    """A CUDA error as torch raises it (torch/csrc/Exceptions.cpp, _new_accelerator_error_object):
    AcceleratorError made from the message, then `error_code` set on it."""
    import torch

    exc = torch.AcceleratorError(f"CUDA error: {text}\nCUDA kernel errors might be asynchronously reported")
    exc.error_code = code  # type: ignore[attr-defined]
    return exc


class Device:
    """The device check, as NVML would answer for cuda:N; records which devices were asked."""

    def __init__(self, says: str | None) -> None:
        self.says = says
        self.asked: list[int] = []

    def __call__(self, index: int) -> str | None:
        self.asked.append(index)
        return self.says


def recorded(tmp_path: Path, exc: BaseException | None, device_index: int | None, device: Device) -> Failure:
    dist = dist_env(rank=2, job_id="77", device_index=device_index)
    crash.record(tmp_path, dist, 5, "an error" if exc is None else repr(exc), exc, ask_device=device)
    failure = Failure.read_for(tmp_path, AttemptId("77", 0))
    assert failure is not None
    return failure


def test_an_internal_assert_naming_nvml_blames_no_cpu_rank(tmp_path: Path) -> None:
    device = Device("NVML: GPU is lost")
    failure = recorded(tmp_path, NVML_ASSERT, None, device)
    assert not failure.bad_hosts
    assert device.asked == []  # a CPU rank has no device to ask
    assert (failure.exception, failure.step) == ("RuntimeError", 5)


def test_an_internal_assert_naming_nvml_blames_no_sound_device(tmp_path: Path) -> None:
    device = Device(None)
    failure = recorded(tmp_path, NVML_ASSERT, 1, device)
    assert not failure.bad_hosts
    assert device.asked == [1]


def test_a_device_that_says_it_is_broken_blames_its_host(tmp_path: Path) -> None:
    failure = recorded(tmp_path, NVML_ASSERT, 1, Device("NVML: GPU is lost"))
    assert failure.bad_hosts is not None
    ((host, why),) = failure.bad_hosts.items()
    assert host == socket.gethostname()
    assert why.startswith("rank 2, cuda:1: NVML: GPU is lost: RuntimeError('NVML_SUCCESS == r")


def test_a_crash_without_an_exception_is_put_to_the_device(tmp_path: Path) -> None:
    device = Device(None)
    assert not recorded(tmp_path, None, 0, device).bad_hosts
    assert device.asked == [0]


@pytest.mark.parametrize(
    ("code", "text", "name"),
    [
        (214, "uncorrectable ECC error encountered", "cudaErrorECCUncorrectable (214)"),
        (
            220,
            "uncorrectable NVLink error detected during the execution",
            "cudaErrorNvlinkUncorrectable (220)",
        ),
        (46, "CUDA-capable device(s) is/are busy or unavailable", "cudaErrorDevicesUnavailable (46)"),
    ],
)
def test_a_cuda_error_code_of_a_broken_device_blames_its_host(
    tmp_path: Path, code: int, text: str, name: str
) -> None:
    failure = recorded(tmp_path, accelerator_error(code, text), 0, Device(None))
    assert failure.bad_hosts is not None
    assert failure.bad_hosts[socket.gethostname()].startswith(f"rank 2, cuda:0: {name}: AcceleratorError(")
    assert failure.exception == "AcceleratorError"


@pytest.mark.parametrize(
    ("code", "text"),
    [(719, "unspecified launch failure"), (700, "an illegal memory access was encountered")],
)
def test_a_cuda_error_a_programs_bug_raises_too_blames_only_with_the_devices_word(
    tmp_path: Path, code: int, text: str
) -> None:
    assert not recorded(tmp_path / "sound", accelerator_error(code, text), 0, Device(None)).bad_hosts
    lost = recorded(tmp_path / "lost", accelerator_error(code, text), 0, Device("NVML: GPU is lost"))
    assert lost.bad_hosts is not None and "NVML: GPU is lost" in lost.bad_hosts[socket.gethostname()]


def test_the_code_is_found_under_the_users_own_exception() -> None:
    def train() -> None:
        try:
            raise accelerator_error(214, "uncorrectable ECC error encountered")
        except RuntimeError as exc:
            raise ValueError("the step failed") from exc

    with pytest.raises(ValueError) as caught:
        train()
    assert crash.cuda_error_code(caught.value) == 214
    assert crash.cuda_error_code(NVML_ASSERT) is None
    # Words alone are no code: a RuntimeError that says what AcceleratorError says.
    assert crash.cuda_error_code(RuntimeError("CUDA error: uncorrectable ECC error encountered")) is None


class FakeNvml:
    """pynvml's surface that nvml_problem reads, over one GPU."""

    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_ERROR_GPU_IS_LOST = 15
    NVML_ERROR_RESET_REQUIRED = 16

    class NVMLError(Exception):
        def __init__(self, value: int) -> None:
            super().__init__({3: "Not Supported", 15: "GPU is lost"}.get(value, "Unknown Error"))
            self.value = value

    def __init__(
        self, *, uncorrected: int | None = 0, rows: tuple[int, int, int, int] | None = (0, 0, 0, 0)
    ) -> None:
        self.uncorrected, self.rows, self.lost = uncorrected, rows, False

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
        if self.lost:
            raise self.NVMLError(self.NVML_ERROR_GPU_IS_LOST)
        return uuid

    def nvmlDeviceGetTotalEccErrors(self, handle: str, kind: int, counter: int) -> int:
        assert (kind, counter) == (self.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, self.NVML_VOLATILE_ECC)
        if self.uncorrected is None:
            raise self.NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        return self.uncorrected

    def nvmlDeviceGetRemappedRows(self, handle: str) -> tuple[int, int, int, int]:
        if self.rows is None:
            raise self.NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        return self.rows


def test_nvml_finds_nothing_wrong_with_a_sound_gpu_or_one_without_ecc() -> None:
    assert crash.nvml_problem(FakeNvml(), "GPU-1") is None
    assert crash.nvml_problem(FakeNvml(uncorrected=None, rows=None), "GPU-1") is None


def test_nvml_names_a_lost_gpu_and_its_memory_errors() -> None:
    lost = FakeNvml()
    lost.lost = True
    assert crash.nvml_problem(lost, "GPU-1") == "NVML: GPU is lost"
    ecc = crash.nvml_problem(FakeNvml(uncorrected=2), "GPU-1")
    assert ecc == "NVML: 2 uncorrectable ECC error(s) since the driver loaded"
    pending = crash.nvml_problem(FakeNvml(uncorrected=None, rows=(0, 1, 1, 0)), "GPU-1")
    assert pending == "NVML: a memory row remap is pending: the GPU needs a reset"
    failed = crash.nvml_problem(FakeNvml(rows=(0, 1, 0, 1)), "GPU-1")
    assert failed == "NVML: a memory row with uncorrectable errors could not be remapped"


def has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.skipif(not has_cuda(), reason="needs a CUDA GPU")
def test_torch_gives_a_real_cuda_error_its_code_and_a_sound_gpu_blames_no_host(tmp_path: Path) -> None:
    import torch

    with pytest.raises(RuntimeError) as caught:
        torch.zeros(1).to(f"cuda:{torch.cuda.device_count()}")  # no such device
    assert crash.cuda_error_code(caught.value) == 101  # cudaErrorInvalidDevice
    crash.record(tmp_path, dist_env(job_id="9", device_index=0), 1, repr(caught.value), caught.value)
    failure = Failure.read_for(tmp_path, AttemptId("9", 0))
    assert failure is not None and not failure.bad_hosts
    assert crash.nvml_fault(0) is None
