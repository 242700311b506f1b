"""A rank's crash, recorded for the requeue decision (job/allocation/requeue.py): where the attempt crashed,
and whether the node's device is to blame; and, for the user, what their code raised and where.

A node is blamed on its device's own evidence, never on the words of an error: the requeue leaves a
blamed node out for the rest of the run, and a message that says "NVML" or "ECC" may be a library's
internal assert on a sound GPU (`NVML_SUCCESS == r INTERNAL ASSERT FAILED`, from torch's caching
allocator). The evidence is the CUDA error code torch's AcceleratorError carries, where that code
means a broken device whatever ran on it, or what NVML says of this rank's own device when asked at
the crash. Without either the attempt is retried on the same nodes, where the next attempt's device
check (preflight.check_device, in a fresh process) finds a device that is really gone.
"""

from __future__ import annotations

import contextlib
import importlib
import site
import socket
import sysconfig
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from slurmddp.job.process.distenv import DistEnv
from slurmddp.rundir.records import AttemptId, CodeSite, Failure

BROKEN_DEVICE = {
    46: "cudaErrorDevicesUnavailable",
    214: "cudaErrorECCUncorrectable",
    220: "cudaErrorNvlinkUncorrectable",
}
"""cudaError_t codes (CUDA's driver_types.h) by which the device says it is broken or taken by
another process, whatever code ran on it. A launch failure (719), an illegal address (700) or an
unknown error (999) a program's own bug raises too: those blame the node only where NVML confirms."""
NVML_WAIT_S = 10.0
"""How long a crash waits for NVML's answer: a query of a GPU in a bad state can block, and a rank
that does not exit holds its whole step."""
MESSAGE_CHARS = 2000
"""Enough for any message worth reading; a tensor's repr in one is cut."""

DeviceCheck = Callable[[int], str | None]
"""Asks the device cuda:N what is wrong with it now: why it is broken, or None."""


def record(
    run_dir: Path,
    dist: DistEnv,
    step: int | None,
    error: str,
    exc: BaseException | None = None,
    *,
    ask_device: DeviceCheck | None = None,
) -> None:
    """Where the attempt crashed, for the failure budget (a crash at the same step twice stops),
    and that it crashed: the other ranks then get srun's SIGTERM, which is no stop request. A
    device fault (`device_fault`; `ask_device` defaults to `nvml_fault`) names this host, which the
    requeued job then leaves out; a CPU rank has no device to blame. `exc`, the exception that
    ended the rank, is recorded as its type, message and the user's line that raised it. The
    attempt's first record stands (Failure.write)."""
    index = dist.device_index
    fault = None if index is None else device_fault(exc, index, ask_device or nvml_fault)
    host = socket.gethostname()
    Failure(
        step=step,
        rank=dist.rank,
        error=error,
        attempt=AttemptId.of(dist),
        time=time.time(),
        bad_hosts={host: f"rank {dist.rank}, cuda:{index}: {fault}: {error[:300]}"} if fault else {},
        exception=None if exc is None else type(exc).__name__,
        message=None if exc is None else str(exc)[:MESSAGE_CHARS],
        where=None if exc is None else users_frame(exc),
    ).write(run_dir)


def device_fault(exc: BaseException | None, device_index: int, ask_device: DeviceCheck) -> str | None:
    """Why the device cuda:`device_index` is to blame for the crash: the CUDA error code of `exc`
    (or of an exception in its chain) where that code means a broken device, else what
    `ask_device` finds now; None when neither says so."""
    code = cuda_error_code(exc)
    if code in BROKEN_DEVICE:
        return f"{BROKEN_DEVICE[code]} ({code})"
    return ask_device(device_index)


def cuda_error_code(exc: BaseException | None) -> int | None:
    """The cudaError_t code of `exc`, or of the exception it was raised from or while handling:
    torch's AcceleratorError (torch 2.8 on) carries one in `error_code`. A CUDA error torch raises
    as a plain RuntimeError (older torch, its STD_CUDA_CHECK) carries none."""
    import torch

    accelerator_error = getattr(torch, "AcceleratorError", None)
    seen: set[int] = set()
    while exc is not None and accelerator_error is not None and id(exc) not in seen:
        seen.add(id(exc))
        code = getattr(exc, "error_code", None)
        if isinstance(exc, accelerator_error) and isinstance(code, int):
            return code
        exc = exc.__cause__ or exc.__context__
    return None


def nvml_fault(device_index: int) -> str | None:
    """What NVML says is wrong with cuda:`device_index` now: lost (fallen off the bus), in need of
    a reset, uncorrectable ECC errors since the driver loaded, a memory row it could not remap or
    one waiting for a reset. None where it finds nothing wrong, or cannot be asked (nvidia-ml-py
    not installed, NVML not loaded, no answer within NVML_WAIT_S): no evidence blames no node."""
    try:
        nvml = importlib.import_module("pynvml")
    except ImportError:
        return None
    answer: list[str | None] = []
    asking = threading.Thread(target=lambda: answer.append(_ask_nvml(nvml, device_index)), daemon=True)
    asking.start()
    asking.join(NVML_WAIT_S)
    return answer[0] if answer else None


def _ask_nvml(nvml: Any, device_index: int) -> str | None:
    import torch

    try:
        # By UUID: NVML numbers every GPU of the node, CUDA only those the task may use (a cgroup's
        # CUDA_VISIBLE_DEVICES=0 can be the node's third GPU).
        uuid = f"GPU-{torch.cuda.get_device_properties(device_index).uuid}"
        nvml.nvmlInit()
    except Exception:
        return None
    try:
        return nvml_problem(nvml, uuid)
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()


def nvml_problem(nvml: Any, uuid: str) -> str | None:
    """What `nvml` (the pynvml module, initialised) says is wrong with the GPU `uuid`; None where
    it reports nothing wrong, or the device cannot be found."""
    try:
        handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
        uncorrected = _query(
            nvml,
            "nvmlDeviceGetTotalEccErrors",
            handle,
            nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            nvml.NVML_VOLATILE_ECC,
        )
        rows = _query(nvml, "nvmlDeviceGetRemappedRows", handle)
    except nvml.NVMLError as error:
        return f"NVML: {error}" if _device_gone(nvml, error) else None
    if uncorrected:
        return f"NVML: {uncorrected} uncorrectable ECC error(s) since the driver loaded"
    if rows is not None and rows[3]:
        return "NVML: a memory row with uncorrectable errors could not be remapped"
    if rows is not None and rows[2]:
        return "NVML: a memory row remap is pending: the GPU needs a reset"
    return None


def _query(nvml: Any, name: str, *args: Any) -> Any:
    """What NVML's `name` answers; None where the device or nvidia-ml-py's version has no such
    query (no ECC on a consumer GPU, no row remapping before Ampere). A device that is gone says so
    in any query: that is raised."""
    call = getattr(nvml, name, None)
    if call is None:
        return None
    try:
        return call(*args)
    except nvml.NVMLError as error:
        if _device_gone(nvml, error):
            raise
        return None


def _device_gone(nvml: Any, error: Any) -> bool:
    return getattr(error, "value", None) in (nvml.NVML_ERROR_GPU_IS_LOST, nvml.NVML_ERROR_RESET_REQUIRED)


def users_frame(exc: BaseException) -> CodeSite | None:
    """The innermost frame of the traceback in the user's own code: not in Python's standard
    library (runpy included), an installed library (submitit, torch, omegaconf: their frames say
    how a mistake was noticed, not where it was made), or slurmddp."""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if frame.lineno is not None and not _foreign(frame.filename):
            return CodeSite(frame.filename, frame.lineno, frame.name)
    return None


def _foreign(filename: str) -> bool:
    if filename.startswith("<"):  # <frozen runpy>, <string>
        return True
    path = Path(filename).resolve()
    return any(path.is_relative_to(root) for root in _not_users())


def _not_users() -> list[Path]:
    paths = sysconfig.get_paths()
    roots = [paths[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")]
    roots += [*site.getsitepackages(), site.getusersitepackages(), str(Path(__file__).parents[1])]
    return [Path(root).resolve() for root in roots]
