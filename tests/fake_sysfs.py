"""Fake sysfs trees that mirror real machines, for fabric detection (slurmddp.cluster.fabric); the
unit tests of tests/cluster/test_fabric.py and the cluster tests (SLURMDDP_SYSFS) build them.

The trees are built per test (in tmp_path) with the same shape the kernel gives them: RDMA devices and
netdevs live under their PCI function in devices/, /sys/class/{infiniband,net}/<name> are symlinks to
them, and each one's `device` link points back to the PCI function (whose `driver` link names the
kernel driver). File contents are what the kernel prints: "4: ACTIVE", "400 Gb/sec (4X NDR)", GIDs in
full %pI6 form, "RoCE v2" / "IB/RoCE v1" GID types, and no readable type for an empty GID slot or an
InfiniBand GID (the kernel answers EINVAL there, like a missing file here).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"


def ipv4_gid(address: str) -> str:
    a, b, c, d = (int(x) for x in address.split("."))
    return f"0000:0000:0000:0000:0000:ffff:{a:02x}{b:02x}:{c:02x}{d:02x}"


@dataclass
class Port:
    state: str = "4: ACTIVE"
    link_layer: str = "InfiniBand"
    rate: str = "400 Gb/sec (4X NDR)"
    phys_state: str = "5: LinkUp"
    gids: list[tuple[str, str | None, str | None]] = field(default_factory=list)
    """(gid, type or None for an unreadable type, ndev or None)."""


class FakeSysfs:
    """Builds a sysfs tree under `root` (see the module docstring)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        for d in ("class/infiniband", "class/net", "devices/virtual/net", "bus/pci/drivers"):
            (root / d).mkdir(parents=True, exist_ok=True)

    def _write(self, path: Path, text: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")

    def _link(self, link: Path, target: Path) -> None:
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(target, link.parent))

    def pci(self, address: str, driver: str, vendor: str, device: str) -> Path:
        path = self.root / "devices" / f"pci0000:{address[5:7]}" / address
        self._write(path / "vendor", vendor)
        self._write(path / "device", device)
        (self.root / "bus/pci/drivers" / driver).mkdir(exist_ok=True)
        self._link(path / "driver", self.root / "bus/pci/drivers" / driver)
        return path

    def rdma(self, name: str, pci: Path, ports: Mapping[int, Port]) -> None:
        path = pci / "infiniband" / name
        self._link(self.root / "class/infiniband" / name, path)
        self._link(path / "device", pci)
        self._write(path / "node_type", "1: CA")
        for number, port in ports.items():
            pdir = path / "ports" / str(number)
            self._write(pdir / "state", port.state)
            self._write(pdir / "phys_state", port.phys_state)
            self._write(pdir / "link_layer", port.link_layer)
            self._write(pdir / "rate", port.rate)
            for index, (gid, gid_type, ndev) in enumerate(port.gids):
                self._write(pdir / "gids" / str(index), gid)
                if gid_type is not None:
                    self._write(pdir / "gid_attrs" / "types" / str(index), gid_type)
                if ndev is not None:
                    self._write(pdir / "gid_attrs" / "ndevs" / str(index), ndev)

    def netdev(
        self,
        name: str,
        pci: Path | None = None,
        *,
        arp_type: int = 1,
        operstate: str = "up",
        speed: int | None = None,
        master: str | None = None,
        dev_port: int = 0,
    ) -> None:
        path = (pci / "net" / name) if pci is not None else (self.root / "devices/virtual/net" / name)
        self._link(self.root / "class/net" / name, path)
        if pci is not None:
            self._link(path / "device", pci)
        self._write(path / "type", str(arp_type))
        self._write(path / "operstate", operstate)
        self._write(path / "dev_port", str(dev_port))
        if speed is not None:
            self._write(path / "speed", str(speed))
        if master is not None:
            self._link(path / "master", self.root / "devices/virtual/net" / master)

    def loopback(self) -> None:
        self.netdev("lo", arp_type=772, operstate="unknown")

    def dmi(self, vendor: str, product: str) -> None:
        dmi = self.root / "devices/virtual/dmi/id"
        self._write(dmi / "sys_vendor", vendor)
        self._write(dmi / "product_name", product)
        self._link(self.root / "class/dmi", self.root / "devices/virtual/dmi")


def ib_port(guid: str, state: str = "4: ACTIVE") -> Port:
    down = not state.endswith("ACTIVE")
    return Port(
        state=state,
        # A port without link reports the slowest rate and "Polling" while it waits for a peer.
        rate="10 Gb/sec (4X SDR)" if down else "400 Gb/sec (4X NDR)",
        phys_state="2: Polling" if down else "5: LinkUp",
        # InfiniBand GID 0: the default subnet prefix fe80:: and the port GUID; no readable type.
        gids=[(f"fe80:0000:0000:0000:{guid}", None, None), (ZERO_GID, None, None)],
    )


def roce_port(netdev: str, ipv4: str | None, mac_eui: str, rate: str = "100 Gb/sec (4X EDR)") -> Port:
    """The GID table mlx5 builds for a netdev: link-local v1/v2, then each IPv4 address as v1/v2
    (so the routable RoCE v2 IPv4 GID lands on index 3), then empty slots."""
    link_local = f"fe80:0000:0000:0000:{mac_eui}"
    gids: list[tuple[str, str | None, str | None]] = [
        (link_local, "IB/RoCE v1", netdev),
        (link_local, "RoCE v2", netdev),
    ]
    if ipv4 is not None:
        gids += [(ipv4_gid(ipv4), "IB/RoCE v1", netdev), (ipv4_gid(ipv4), "RoCE v2", netdev)]
    gids += [(ZERO_GID, None, None)] * 4
    return Port(link_layer="Ethernet", rate=rate, gids=gids)


# --- the machines ----------------------------------------------------------------------------------

# DGX H100 (DGX OS 6): 8 ConnectX-7 NDR compute ports named as on the real box (mlx5_0,3,4,5,6,9,10,11
# with predictable IPoIB names ibp<bus>s0), two ConnectX-7 storage ports in Ethernet mode (mlx5_1/2,
# RoCE-capable) and a 10 GbE management port. Here mlx5_3 has lost its link.
DGX_COMPUTE = [
    ("mlx5_0", "0000:18:00.0", "ibp24s0"),
    ("mlx5_3", "0000:40:00.0", "ibp64s0"),
    ("mlx5_4", "0000:4f:00.0", "ibp79s0"),
    ("mlx5_5", "0000:5e:00.0", "ibp94s0"),
    ("mlx5_6", "0000:9a:00.0", "ibp154s0"),
    ("mlx5_9", "0000:c0:00.0", "ibp192s0"),
    ("mlx5_10", "0000:ce:00.0", "ibp206s0"),
    ("mlx5_11", "0000:dc:00.0", "ibp220s0"),
]


def build_dgx_h100(root: Path, down: Iterable[str] = ("mlx5_3",)) -> FakeSysfs:
    fs = FakeSysfs(root)
    fs.loopback()
    for n, (hca, address, ipoib) in enumerate(DGX_COMPUTE):
        pci = fs.pci(address, "mlx5_core", "0x15b3", "0x1021")
        state = "1: DOWN" if hca in down else "4: ACTIVE"
        fs.rdma(hca, pci, {1: ib_port(f"a088:c203:0047:{n:04x}", state)})
        fs.netdev(ipoib, pci, arp_type=32, operstate="down" if hca in down else "up")
    for hca, address, netdev, ip in [
        ("mlx5_1", "0000:29:00.0", "enp41s0f0np0", "192.168.100.11"),
        ("mlx5_2", "0000:29:00.1", "enp41s0f1np1", "192.168.101.11"),
    ]:
        pci = fs.pci(address, "mlx5_core", "0x15b3", "0x1021")
        fs.rdma(hca, pci, {1: roce_port(netdev, ip, "a288:c2ff:fe3b:5060", "200 Gb/sec (2X NDR)")})
        fs.netdev(netdev, pci, speed=200000)
    fs.netdev("eno3", fs.pci("0000:03:00.0", "ixgbe", "0x8086", "0x15ad"), speed=10000)
    fs.netdev("docker0")
    fs.netdev("veth3f2a1b0", master="docker0")
    return fs


def build_roce(root: Path) -> FakeSysfs:
    """A RoCE v2 server: ConnectX-6 Dx dual-port 100 GbE (one PCI function per port), each port on its
    own rail subnet, plus a 1 GbE management port."""
    fs = FakeSysfs(root)
    fs.loopback()
    for hca, address, netdev, ip in [
        ("mlx5_0", "0000:3b:00.0", "ens1f0np0", "10.0.10.5"),
        ("mlx5_1", "0000:3b:00.1", "ens1f1np1", "10.0.11.5"),
    ]:
        pci = fs.pci(address, "mlx5_core", "0x15b3", "0x101d")
        fs.rdma(hca, pci, {1: roce_port(netdev, ip, "0e42:a1ff:fe8b:1c2e")})
        fs.netdev(netdev, pci, speed=100000)
    fs.netdev("eno1", fs.pci("0000:01:00.0", "tg3", "0x14e4", "0x165f"), speed=1000)
    return fs


EFA_P4D = ["0000:10:1c.0", "0000:20:1c.0", "0000:90:1c.0", "0000:a0:1c.0"]


def build_efa(
    root: Path,
    instance_type: str = "p4d.24xlarge",
    device_id: str = "0xefa1",
    addresses: list[str] = EFA_P4D,
    names: list[str] | None = None,
    enas: tuple[str, ...] = ("ens32", "ens65", "ens130", "ens163"),
) -> FakeSysfs:
    """An EC2 EFA instance: one EFA PCI function per device (driver efa, vendor Amazon 0x1d0f), port 1
    always ACTIVE with link_layer "Unknown" (the kernel's word for IB_LINK_LAYER_UNSPECIFIED), and the
    ENA interfaces on PCI functions of their own (driver ena) -- an EFA has no netdev."""
    fs = FakeSysfs(root)
    fs.loopback()
    fs.dmi("Amazon EC2", instance_type)
    for n, address in enumerate(addresses):
        name = names[n] if names else f"efa_{n}"
        pci = fs.pci(address, "efa", "0x1d0f", device_id)
        gid = f"fe80:0000:0000:0000:04d2:6bff:fe8a:{n:04x}"
        port = Port(link_layer="Unknown", rate="100 Gb/sec (4X EDR)", gids=[(gid, None, None)])
        fs.rdma(name, pci, {1: port})
    for n, ena in enumerate(enas):
        fs.netdev(ena, fs.pci(f"0000:{16 * (n + 1):02x}:1b.0", "ena", "0x1d0f", "0xec20"))
    fs.netdev("docker0", operstate="down")
    return fs


def build_ethernet_only(root: Path) -> FakeSysfs:
    """A plain GPU server: two 25 GbE ports bonded (LACP) into bond0, a 1 GbE management port, and the
    virtual interfaces Docker and libvirt leave behind."""
    fs = FakeSysfs(root)
    fs.loopback()
    fs.netdev("bond0", speed=50000)
    for n, name in enumerate(["enp65s0f0", "enp65s0f1"]):
        pci = fs.pci(f"0000:41:00.{n}", "i40e", "0x8086", "0x158b")
        fs.netdev(name, pci, speed=25000, master="bond0")
    fs.netdev("eno1", fs.pci("0000:01:00.0", "igb", "0x8086", "0x1521"), speed=1000)
    fs.netdev("docker0")
    fs.netdev("veth9a8b7c6", master="docker0")
    fs.netdev("virbr0")
    return fs


def build_nothing(root: Path) -> FakeSysfs:
    """A container or laptop: loopback and an idle Docker bridge."""
    fs = FakeSysfs(root)
    fs.loopback()
    fs.netdev("docker0", operstate="down")
    return fs
