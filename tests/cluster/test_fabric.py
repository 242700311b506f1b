"""Fabric detection and NCCL profiles over fake sysfs trees that mirror real machines (built by
tests/fake_sysfs.py, whose docstring says how they mirror the kernel's)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import get_args

import pytest
from fake_sysfs import (
    DGX_COMPUTE,
    EFA_P4D,
    FakeSysfs,
    build_dgx_h100,
    build_efa,
    build_ethernet_only,
    build_nothing,
    build_roce,
    ib_port,
    ipv4_gid,
    roce_port,
)

from slurmddp.cluster.fabric import (
    PROFILES,
    FabricProfile,
    NodeFabric,
    auto_profile,
    describe,
    detect,
    efa_device_rdma,
    in_namespace,
    nccl_env,
)
from slurmddp.errors import ConfigError, SlurmddpError

WATCHDOG = {
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    "TORCH_NCCL_ENABLE_MONITORING": "1",
    "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "480",
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
    "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
}
IB_TIMEOUTS = {"NCCL_IB_TIMEOUT": "22", "NCCL_IB_RETRY_CNT": "7"}


@pytest.fixture
def dgx(tmp_path: Path) -> NodeFabric:
    build_dgx_h100(tmp_path)
    return detect(tmp_path)


# --- detection -------------------------------------------------------------------------------------


def test_detect_dgx_h100(dgx: NodeFabric) -> None:
    assert [d.name for d in dgx.devices] == [
        "mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_9", "mlx5_10", "mlx5_11"
    ]  # fmt: skip
    assert {d.driver for d in dgx.devices} == {"mlx5_core"}
    assert {d.pci_device_id for d in dgx.devices} == {"0x1021"}
    ib = {p.device: p for p in dgx.ib_ports}
    assert len(ib) == 8
    assert ib["mlx5_0"].active and ib["mlx5_0"].rate_gbps == 400.0 and ib["mlx5_0"].netdev == "ibp24s0"
    assert ib["mlx5_3"].state == "DOWN" and not ib["mlx5_3"].active
    assert all(p.roce_v2_gid_index is None for p in ib.values())
    roce = {p.device: p for p in dgx.roce_ports}
    assert roce["mlx5_1"].roce_v2_gid_index == 3 and roce["mlx5_1"].roce_v2_ipv4 == "192.168.100.11"
    assert roce["mlx5_1"].netdev == "enp41s0f0np0" and roce["mlx5_1"].rate_gbps == 200.0
    assert dgx.instance_type is None
    assert auto_profile(dgx) == "infiniband"


def test_detect_finds_netdevs_from_either_side(tmp_path: Path) -> None:
    # Some kernels' device/net lists lack the interface; class/net/<if>/device still leads back.
    fs = FakeSysfs(tmp_path)
    pci = fs.pci("0000:18:00.0", "mlx5_core", "0x15b3", "0x1021")
    fs.rdma("mlx5_0", pci, {1: ib_port("a088:c203:0047:0001")})
    fs.netdev("ib0", arp_type=32)
    fs._link(tmp_path / "devices/virtual/net/ib0/device", pci)
    assert not (pci / "net").exists()
    fabric = detect(tmp_path)
    assert fabric.ib_ports[0].netdev == "ib0"


def test_detect_roce_picks_the_ipv4_roce_v2_gid_wherever_it_is(tmp_path: Path) -> None:
    # A netdev with global IPv6 addresses gets those GIDs first; the IPv4 v2 GID then sits at index 5.
    fs = FakeSysfs(tmp_path)
    pci = fs.pci("0000:3b:00.0", "mlx5_core", "0x15b3", "0x101d")
    port = roce_port("ens1f0np0", None, "0e42:a1ff:fe8b:1c2e")
    ipv6 = "fd00:0010:0000:0000:0000:0000:0000:0005"
    port.gids[2:2] = [
        (ipv6, "IB/RoCE v1", "ens1f0np0"),
        (ipv6, "RoCE v2", "ens1f0np0"),
        (ipv4_gid("10.0.10.5"), "IB/RoCE v1", "ens1f0np0"),
        (ipv4_gid("10.0.10.5"), "RoCE v2", "ens1f0np0"),
    ]
    fs.rdma("mlx5_0", pci, {1: port})
    fs.netdev("ens1f0np0", pci, speed=100000)
    (p,) = detect(tmp_path).roce_ports
    assert (p.roce_v2_gid_index, p.roce_v2_ipv4, p.netdev) == (5, "10.0.10.5", "ens1f0np0")


def test_detect_missing_sysfs_is_an_empty_fabric(tmp_path: Path) -> None:
    fabric = detect(tmp_path / "no-such-dir")
    assert fabric == NodeFabric(devices=(), interfaces=(), instance_type=None)
    assert auto_profile(fabric) == "tcp"


# --- InfiniBand: the DGX H100 ----------------------------------------------------------------------

DGX_IB = {
    "NCCL_IB_HCA": "=mlx5_0:1,mlx5_4:1,mlx5_5:1,mlx5_6:1,mlx5_9:1,mlx5_10:1,mlx5_11:1",
    **IB_TIMEOUTS,
    "NCCL_SOCKET_IFNAME": "=ibp24s0",
    "GLOO_SOCKET_IFNAME": "ibp24s0",
    **WATCHDOG,
}
DGX_EXPECTED: dict[str, dict[str, str]] = {
    "auto": DGX_IB,
    "infiniband": DGX_IB,
    "roce": {
        "NCCL_IB_HCA": "=mlx5_1:1,mlx5_2:1",
        **IB_TIMEOUTS,
        "NCCL_IB_GID_INDEX": "3",
        "NCCL_SOCKET_IFNAME": "=enp41s0f0np0",
        "GLOO_SOCKET_IFNAME": "enp41s0f0np0",
        **WATCHDOG,
    },
    "tcp": {
        "NCCL_IB_DISABLE": "1",
        "NCCL_NET": "Socket",
        "NCCL_SOCKET_IFNAME": "=enp41s0f0np0",
        "GLOO_SOCKET_IFNAME": "enp41s0f0np0",
        **WATCHDOG,
    },
    "none": {},
}


@pytest.mark.parametrize("profile", sorted(DGX_EXPECTED))
def test_dgx_h100_env(dgx: NodeFabric, profile: str) -> None:
    assert nccl_env(dgx, profile, {}) == DGX_EXPECTED[profile]


def test_dgx_h100_efa_profile_says_what_is_there(dgx: NodeFabric) -> None:
    with pytest.raises(ConfigError, match=r"no EFA device; found: 8 InfiniBand HCAs \(7 active"):
        nccl_env(dgx, "efa", {})


def test_dgx_h100_describe(dgx: NodeFabric) -> None:
    assert describe(dgx) == (
        "8 InfiniBand HCAs (7 active; mlx5_3 port 1 DOWN), 400 Gb/s, IPoIB ibp24s0; "
        "2 RoCE ports (2 active; RoCE v2 GID 3), 200 Gb/s, interfaces enp41s0f0np0/enp41s0f1np1; "
        "Ethernet up: enp41s0f0np0 200 Gb/s, enp41s0f1np1 200 Gb/s, eno3 10 Gb/s"
    )


def test_ib_without_ipoib_bootstraps_over_ethernet(tmp_path: Path) -> None:
    fs = build_dgx_h100(tmp_path, down=())
    for _, _, ipoib in DGX_COMPUTE:
        (tmp_path / "class/net" / ipoib / "operstate").write_text("down\n")
    del fs
    env = nccl_env(detect(tmp_path), "infiniband", {})
    assert env["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_3:1,mlx5_4:1,mlx5_5:1,mlx5_6:1,mlx5_9:1,mlx5_10:1,mlx5_11:1"
    assert (env["NCCL_SOCKET_IFNAME"], env["GLOO_SOCKET_IFNAME"]) == ("=enp41s0f0np0", "enp41s0f0np0")


def test_ib_with_every_port_down(tmp_path: Path) -> None:
    build_dgx_h100(tmp_path, down=[hca for hca, _, _ in DGX_COMPUTE])
    fabric = detect(tmp_path)
    assert auto_profile(fabric) == "roce"
    with pytest.raises(ConfigError) as err:
        nccl_env(fabric, "infiniband", {})
    message = str(err.value)
    assert "no active InfiniBand port" in message
    assert "8 InfiniBand HCAs (0 active; mlx5_0 port 1 DOWN; mlx5_3 port 1 DOWN;" in message
    assert "no IPoIB interface up" in message and "2 RoCE ports" in message


# --- RoCE ------------------------------------------------------------------------------------------

ROCE_ENV = {
    "NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1",
    **IB_TIMEOUTS,
    "NCCL_IB_GID_INDEX": "3",
    "NCCL_SOCKET_IFNAME": "=ens1f0np0",
    "GLOO_SOCKET_IFNAME": "ens1f0np0",
    **WATCHDOG,
}


@pytest.mark.parametrize("profile", ["auto", "roce"])
def test_roce_env(tmp_path: Path, profile: str) -> None:
    build_roce(tmp_path)
    assert nccl_env(detect(tmp_path), profile, {}) == ROCE_ENV


def test_roce_tcp_and_describe(tmp_path: Path) -> None:
    build_roce(tmp_path)
    fabric = detect(tmp_path)
    assert nccl_env(fabric, "tcp", {}) == {
        "NCCL_IB_DISABLE": "1",
        "NCCL_NET": "Socket",
        "NCCL_SOCKET_IFNAME": "=ens1f0np0",
        "GLOO_SOCKET_IFNAME": "ens1f0np0",
        **WATCHDOG,
    }
    assert describe(fabric) == (
        "2 RoCE ports (2 active; RoCE v2 GID 3), 100 Gb/s, interfaces ens1f0np0/ens1f1np1; "
        "Ethernet up: ens1f0np0 100 Gb/s, ens1f1np1 100 Gb/s, eno1 1 Gb/s"
    )
    with pytest.raises(ConfigError, match="no active InfiniBand port; found: 2 RoCE ports"):
        nccl_env(fabric, "infiniband", {})


def test_roce_ports_with_different_gid_indices_leave_the_index_to_nccl(tmp_path: Path) -> None:
    build_roce(tmp_path)
    gids = tmp_path / "class/infiniband/mlx5_1/ports/1/gid_attrs/types"
    (gids / "3").write_text("IB/RoCE v1\n")  # only the v1 GID at 3 ...
    (tmp_path / "class/infiniband/mlx5_1/ports/1/gids/5").write_text(ipv4_gid("10.0.11.5") + "\n")
    (gids / "5").write_text("RoCE v2\n")  # ... and the v2 one at 5
    env = nccl_env(detect(tmp_path), "roce", {})
    assert "NCCL_IB_GID_INDEX" not in env
    assert env["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_1:1"


def test_roce_without_ipv4_address(tmp_path: Path) -> None:
    fs = FakeSysfs(tmp_path)
    pci = fs.pci("0000:3b:00.0", "mlx5_core", "0x15b3", "0x101d")
    fs.rdma("mlx5_0", pci, {1: roce_port("ens1f0np0", None, "0e42:a1ff:fe8b:1c2e")})
    fs.netdev("ens1f0np0", pci, speed=100000)
    fabric = detect(tmp_path)
    assert auto_profile(fabric) == "tcp"
    assert "mlx5_0:1 has no IPv4 RoCE v2 GID" in describe(fabric)
    with pytest.raises(ConfigError, match=r"\(mlx5_0:1\) have no RoCE v2 GID with an IPv4 address"):
        nccl_env(fabric, "roce", {})


# --- EFA -------------------------------------------------------------------------------------------


def efa_env(iface: str, rdma: bool) -> dict[str, str]:
    return {
        "FI_PROVIDER": "efa",
        "NCCL_NET": "AWS Libfabric",
        **({"FI_EFA_USE_DEVICE_RDMA": "1"} if rdma else {}),
        "NCCL_SOCKET_IFNAME": "=" + iface,
        "GLOO_SOCKET_IFNAME": iface,
        **WATCHDOG,
    }


@pytest.mark.parametrize("profile", ["auto", "efa"])
def test_efa_p4d_env(tmp_path: Path, profile: str) -> None:
    build_efa(tmp_path)
    assert nccl_env(detect(tmp_path), profile, {}) == efa_env("ens32", rdma=True)


def test_efa_p4d_detect_and_describe(tmp_path: Path) -> None:
    build_efa(tmp_path)
    fabric = detect(tmp_path)
    assert [d.name for d in fabric.efa_devices] == ["efa_0", "efa_1", "efa_2", "efa_3"]
    assert {(d.driver, d.pci_device_id) for d in fabric.devices} == {("efa", "0xefa1")}
    assert fabric.ib_ports == () and fabric.roce_ports == ()
    assert fabric.instance_type == "p4d.24xlarge"
    assert describe(fabric) == (
        "4 EFA devices (4 active), 100 Gb/s, device RDMA on (p4d.24xlarge); "
        "Ethernet up: ens32, ens65, ens130, ens163"
    )
    assert nccl_env(fabric, "tcp", {}) == {
        "NCCL_IB_DISABLE": "1",
        "NCCL_NET": "Socket",
        "NCCL_SOCKET_IFNAME": "=ens32",
        "GLOO_SOCKET_IFNAME": "ens32",
        **WATCHDOG,
    }
    with pytest.raises(ConfigError, match="no active RoCE port; found: 4 EFA devices"):
        nccl_env(fabric, "roce", {})


def test_efa_p5_with_udev_names(tmp_path: Path) -> None:
    # p5.48xlarge on Ubuntu: 32 EFAs named by rdma-core's udev rule (rdmap<bus>s<slot>), found by
    # their driver rather than by an efa_ prefix.
    buses = range(0x4F, 0x4F + 32)
    build_efa(
        tmp_path,
        instance_type="p5.48xlarge",
        addresses=[f"0000:{b:02x}:00.0" for b in buses],
        names=[f"rdmap{b}s0" for b in buses],
        enas=("enp71s0",),
    )
    fabric = detect(tmp_path)
    assert len(fabric.efa_devices) == 32 and efa_device_rdma(fabric)
    assert nccl_env(fabric, "auto", {}) == efa_env("enp71s0", rdma=True)


@pytest.mark.parametrize(
    ("instance_type", "device_id", "rdma"),
    [
        ("c5n.18xlarge", "0xefa0", False),  # first-generation EFA: no RDMA read
        ("g5.48xlarge", "0xefa1", False),  # not a family known to do RDMA read: leave it to libfabric
        ("p5en.48xlarge", "0xefa2", True),  # libfabric itself assumes RDMA from 0xefa2 on
    ],
)
def test_efa_device_rdma_only_where_supported(
    tmp_path: Path, instance_type: str, device_id: str, rdma: bool
) -> None:
    build_efa(tmp_path, instance_type=instance_type, device_id=device_id, addresses=EFA_P4D[:1])
    fabric = detect(tmp_path)
    assert efa_device_rdma(fabric) is rdma
    assert nccl_env(fabric, "efa", {}) == efa_env("ens32", rdma=rdma)


# --- Ethernet only, nothing at all ------------------------------------------------------------------

ETHERNET_ENV = {
    "NCCL_IB_DISABLE": "1",
    "NCCL_NET": "Socket",
    "NCCL_SOCKET_IFNAME": "=bond0",
    "GLOO_SOCKET_IFNAME": "bond0",
    **WATCHDOG,
}


@pytest.mark.parametrize("profile", ["auto", "tcp"])
def test_ethernet_only_env(tmp_path: Path, profile: str) -> None:
    build_ethernet_only(tmp_path)
    assert nccl_env(detect(tmp_path), profile, {}) == ETHERNET_ENV


def test_ethernet_only_describe_and_errors(tmp_path: Path) -> None:
    build_ethernet_only(tmp_path)
    fabric = detect(tmp_path)
    # The bond's slaves and the docker/veth/virbr interfaces are not candidates.
    assert describe(fabric) == "no RDMA devices; Ethernet up: bond0 50 Gb/s, eno1 1 Gb/s"
    for profile in ("infiniband", "roce", "efa"):
        with pytest.raises(ConfigError, match="found: no RDMA devices; Ethernet up: bond0"):
            nccl_env(fabric, profile, {})


def test_no_fabric_at_all(tmp_path: Path) -> None:
    build_nothing(tmp_path)
    fabric = detect(tmp_path)
    expected = {"NCCL_IB_DISABLE": "1", "NCCL_NET": "Socket", **WATCHDOG}
    assert nccl_env(fabric, "auto", {}) == expected
    assert nccl_env(fabric, "tcp", {}) == expected
    assert nccl_env(fabric, "none", {}) == {}
    assert describe(fabric) == "no RDMA devices; no Ethernet interface up"
    for profile in ("infiniband", "roce", "efa"):
        with pytest.raises(SlurmddpError, match="found: no RDMA devices; no Ethernet interface up"):
            nccl_env(fabric, profile, {})


# --- the user's fabric.env -------------------------------------------------------------------------


def test_user_values_win(dgx: NodeFabric) -> None:
    user = {
        "NCCL_IB_HCA": "=mlx5_0:1,mlx5_4:1",
        "NCCL_SOCKET_IFNAME": "=eno3",
        "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "900",
        "NCCL_DEBUG": "INFO",
    }
    assert nccl_env(dgx, "auto", user) == {**DGX_IB, **user}
    assert nccl_env(dgx, "none", user) == user


@pytest.mark.parametrize("build", [build_dgx_h100, build_roce, build_efa, build_ethernet_only, build_nothing])
@pytest.mark.parametrize("profile", ["auto", "tcp", "none"])
def test_result_is_derived_updated_by_user(
    tmp_path: Path, build: Callable[[Path], FakeSysfs], profile: str
) -> None:
    build(tmp_path)
    fabric = detect(tmp_path)
    user = {"NCCL_SOCKET_IFNAME": "=lo", "NCCL_NET": "IB", "FOO": "bar"}
    assert nccl_env(fabric, profile, user) == {**nccl_env(fabric, profile, {}), **user}


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("=mlx5_12:1", "no HCA 'mlx5_12'"),
        ("=mlx5_0:1,mlx5_7:1", "no HCA 'mlx5_7'"),
        ("^=mlx5_7", "excludes 'mlx5_7'"),
        ("mlx6", "no HCA whose name starts with 'mlx6'"),
        ("=mlx5_0:2", "port 'mlx5_0:2'"),
        ("=mlx5_0:x", "port 'x' is not a number"),
    ],
)
def test_user_hca_that_does_not_exist(dgx: NodeFabric, value: str, needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        nccl_env(dgx, "auto", {"NCCL_IB_HCA": value})
    message = str(err.value)
    assert needle in message and f"NCCL_IB_HCA={value!r}" in message
    if "no HCA" in needle:
        assert "mlx5_0, mlx5_1, mlx5_2, mlx5_3" in message  # says what there is


@pytest.mark.parametrize("value", ["mlx5", "mlx5_1", "=mlx5_0:1,mlx5_11:1", "^=mlx5_3", "^mlx5_1", ""])
def test_user_hca_that_exists(dgx: NodeFabric, value: str) -> None:
    assert nccl_env(dgx, "auto", {"NCCL_IB_HCA": value})["NCCL_IB_HCA"] == value


def test_user_hca_on_a_node_without_rdma(tmp_path: Path) -> None:
    build_ethernet_only(tmp_path)
    with pytest.raises(ConfigError, match="its RDMA devices are: none"):
        nccl_env(detect(tmp_path), "tcp", {"NCCL_IB_HCA": "=mlx5_0"})
    # `none` checks nothing, as it sets nothing.
    assert nccl_env(detect(tmp_path), "none", {"NCCL_IB_HCA": "=mlx5_0"}) == {"NCCL_IB_HCA": "=mlx5_0"}


def test_unknown_profile(dgx: NodeFabric) -> None:
    with pytest.raises(ConfigError) as err:
        nccl_env(dgx, "ib", {})
    assert str(err.value) == (
        "fabric.profile: unknown profile 'ib'; valid profiles: auto, infiniband, roce, efa, tcp, none"
    )
    assert PROFILES == ("auto", "infiniband", "roce", "efa", "tcp", "none")
    assert get_args(FabricProfile) == PROFILES


def test_only_interfaces_of_this_namespace(dgx: NodeFabric) -> None:
    # The rank's network namespace has eno3 only: the IPoIB names sysfs shows are not usable here.
    visible = in_namespace(dgx, {"lo", "eno3"})
    env = nccl_env(visible, "auto", {})
    assert env["NCCL_SOCKET_IFNAME"] == "=eno3" and env["GLOO_SOCKET_IFNAME"] == "eno3"
    assert env["NCCL_IB_HCA"].startswith("=mlx5_0:1")
    assert "GLOO_SOCKET_IFNAME" not in nccl_env(in_namespace(dgx, {"lo"}), "tcp", {})
