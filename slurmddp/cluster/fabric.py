"""Which network a node has, read from sysfs, and the NCCL/Gloo environment each fabric profile wants.

Everything here is a pure function of a sysfs root (`detect(Path("/sys"))` on a real node, a fake tree
in the tests) and of plain values: nothing imports torch, opens a verbs device or looks at the live
environment. Detection has to run on the compute node itself (the login node has other hardware), so
each node derives its own settings: interface names may differ from node to node.

Profiles: `auto` picks from what was detected (InfiniBand > RoCE > EFA > tcp); `infiniband`, `roce`,
`efa` and `tcp` insist on one fabric and fail when the node lacks it; `none` sets nothing at all.
Whatever the user put in `fabric.env` wins over every derived value.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

from slurmddp.errors import ConfigError

FabricProfile = Literal["auto", "infiniband", "roce", "efa", "tcp", "none"]
PROFILES: tuple[str, ...] = get_args(FabricProfile)

# Interfaces that never carry traffic between nodes: loopback, the Docker bridge and its per-container
# veth ends, libvirt's NAT bridge. NCCL itself skips lo and docker* unless nothing else is up.
SKIPPED_INTERFACE_PREFIXES = ("lo", "docker", "veth", "virbr")

# ARPHRD_* values of /sys/class/net/<if>/type (include/uapi/linux/if_arp.h).
ARPHRD_ETHER = 1
ARPHRD_INFINIBAND = 32  # IPoIB

# /sys/class/infiniband/<hca>/ports/<n>/state reads "4: ACTIVE"; only ACTIVE ports pass traffic
# (INIT/ARMED mean the subnet manager has not finished bringing the port up).
ACTIVE = "ACTIVE"

# The local ACK timeout of every NCCL queue pair is 4.096 us * 2**NCCL_IB_TIMEOUT (IB spec, 5-bit
# field). NCCL's default is 20 (~4.3 s per try, NCCL 2.14+ `NCCL_PARAM(IbTimeout, "IB_TIMEOUT", 20)`).
# 22 (~17 s per try, ~2 min over 7 retries) rides out a subnet-manager re-route after a link or switch
# failure, which takes seconds on a large fabric, and still fails well inside the 10-minute collective
# timeout of a torch NCCL process group, so the watchdog reports a dead link instead of a hang.
IB_TIMEOUT = "22"
# 7 is the largest value the 3-bit retry_cnt field of a QP can hold (and NCCL's default): set so the
# pair (timeout, retries) is visible in the job log as one deliberate choice.
IB_RETRY_CNT = "7"

# PyTorch's NCCL watchdog, names and defaults checked against torch 2.13's ProcessGroupNCCL.hpp and
# FlightRecorder.hpp. The defaults moved between releases (torch 2.2-2.4: heartbeat 600 s, dump off,
# trace buffer 0), so pinning them gives the same behaviour on every torch >= 2.1 slurmddp accepts.
TORCH_WATCHDOG = {
    # 1 = TearDown: on a failed or timed-out collective, abort the communicators and end the process,
    # so the step fails and Slurm (and our requeue logic) sees it instead of a rank hanging forever.
    # Same value torchrun exports (torch/distributed/elastic/agent/server/local_elastic_agent.py);
    # torch's own default, 3 (SkipCleanUp), skips ncclCommAbort -- a hang in ncclCommAbort is caught by
    # the heartbeat monitor below either way.
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    # The monitor thread kills the process when the watchdog itself is stuck (in a CUDA or NCCL call)
    # for TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC; the dump below needs it on.
    "TORCH_NCCL_ENABLE_MONITORING": "1",
    # 480 s is torch 2.13's default (8 min); pinned because torch 2.2-2.4 used 600 s.
    "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "480",
    # Write the flight recorder's last collectives of every rank on a timeout: the only way to see which
    # rank stopped at which collective. Needs ENABLE_MONITORING and a trace buffer > 0.
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
    # Ring-buffer entries of the flight recorder; 2000 is FlightRecorder.hpp's default, pinned because
    # older ProcessGroupNCCL read this variable with a default of 0 (recorder off, nothing to dump).
    "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
}

# EC2 instance families whose EFA does RDMA read although their device id is 0xefa1. libfabric's EFA
# provider (efa_rdm_get_use_device_rdma) leaves device RDMA off by default for ids 0xefa0/0xefa1 when
# the application asks for a libfabric API older than 1.18, so on these instances it must be asked
# for; AWS documents GPUDirect RDMA for exactly these GPU instances.
EFA_RDMA_INSTANCE_FAMILIES = frozenset({"p4d", "p4de", "p5", "p5e", "p5en"})
# From 0xefa2 on, the same libfabric function takes device RDMA for granted (and aborts without it).
EFA_RDMA_MIN_DEVICE_ID = 0xEFA2

# The name aws-ofi-nccl registers with NCCL. Plugin releases after 1.11 renamed themselves but still
# answer to this spelling, so it works with old and new plugins alike.
AWS_OFI_NCCL_NET = "AWS Libfabric"


@dataclass(frozen=True)
class RdmaPort:
    """One port of an RDMA device (/sys/class/infiniband/<device>/ports/<port>)."""

    device: str
    port: int
    state: str
    """ACTIVE, DOWN, INIT, ARMED, ...; "" when unreadable."""
    link_layer: str
    """InfiniBand, Ethernet (RoCE), or Unknown (what sysfs says for EFA; ibv_devinfo calls it Unspecified)."""
    rate_gbps: float | None
    netdev: str | None
    """The network interface on the same port: IPoIB for InfiniBand, the Ethernet netdev for RoCE."""
    roce_v2_gid_index: int | None
    """First GID index of type "RoCE v2" holding an IPv4-mapped address (what NCCL's auto-selection
    prefers); None on InfiniBand, and on RoCE ports whose netdev has no IPv4 address."""
    roce_v2_ipv4: str | None

    @property
    def active(self) -> bool:
        return self.state == ACTIVE

    @property
    def hca_spec(self) -> str:
        """The port as NCCL_IB_HCA names it: device:port."""
        return f"{self.device}:{self.port}"


@dataclass(frozen=True)
class RdmaDevice:
    """One entry of /sys/class/infiniband: a Mellanox/NVIDIA HCA, a RoCE NIC, an AWS EFA, ..."""

    name: str
    driver: str | None
    """Kernel driver of the PCI function: mlx5_core, efa, bnxt_en, ..."""
    pci_device_id: str | None
    """PCI device id, e.g. 0x1021 (ConnectX-7) or 0xefa1 (EFA generation 2)."""
    ports: tuple[RdmaPort, ...]

    @property
    def is_efa(self) -> bool:
        return self.driver == "efa" or self.name.startswith("efa_")


@dataclass(frozen=True)
class NetInterface:
    """One entry of /sys/class/net."""

    name: str
    arp_type: int | None
    operstate: str
    speed_mbps: int | None
    enslaved: bool
    """Has a master (bond or bridge): its address, if any, lives on the master."""

    @property
    def up(self) -> bool:
        return self.operstate == "up"

    @property
    def skipped(self) -> bool:
        return self.name.startswith(SKIPPED_INTERFACE_PREFIXES)


@dataclass(frozen=True)
class NodeFabric:
    """What one node has for talking to other nodes."""

    devices: tuple[RdmaDevice, ...]
    interfaces: tuple[NetInterface, ...]
    instance_type: str | None = None
    """EC2 instance type from DMI (e.g. p4d.24xlarge), None off EC2."""

    @property
    def ib_ports(self) -> tuple[RdmaPort, ...]:
        return tuple(p for d in self.devices if not d.is_efa for p in d.ports if p.link_layer == "InfiniBand")

    @property
    def roce_ports(self) -> tuple[RdmaPort, ...]:
        return tuple(p for d in self.devices if not d.is_efa for p in d.ports if p.link_layer == "Ethernet")

    @property
    def efa_devices(self) -> tuple[RdmaDevice, ...]:
        return tuple(d for d in self.devices if d.is_efa)

    @property
    def active_ib_ports(self) -> tuple[RdmaPort, ...]:
        return tuple(p for p in self.ib_ports if p.active)

    @property
    def usable_roce_ports(self) -> tuple[RdmaPort, ...]:
        """Active RoCE ports NCCL can route over: RoCE v2 needs an IP address, i.e. an IPv4 GID."""
        return tuple(p for p in self.roce_ports if p.active and p.roce_v2_gid_index is not None)

    @property
    def active_efa_devices(self) -> tuple[RdmaDevice, ...]:
        return tuple(d for d in self.efa_devices if any(p.active for p in d.ports))

    def interface(self, name: str | None) -> NetInterface | None:
        return next((i for i in self.interfaces if i.name == name), None)


# --- detection -------------------------------------------------------------------------------------


def detect(sysfs: Path) -> NodeFabric:
    """Read the node's RDMA devices and network interfaces from a sysfs root (normally /sys)."""
    return NodeFabric(
        devices=tuple(_rdma_device(sysfs, path) for path in _entries(sysfs / "class" / "infiniband")),
        interfaces=tuple(_interface(path) for path in _entries(sysfs / "class" / "net")),
        instance_type=_ec2_instance_type(sysfs),
    )


def natural_key(name: str) -> tuple[tuple[int, str], ...]:
    """Sort key that puts mlx5_2 before mlx5_10 and ens32 before ens130."""
    return tuple((int(part), "") if part.isdigit() else (-1, part) for part in re.split(r"(\d+)", name))


def _entries(directory: Path) -> list[Path]:
    try:
        return sorted(directory.iterdir(), key=lambda p: natural_key(p.name))
    except OSError:
        return []


def _read(path: Path) -> str | None:
    # sysfs answers some reads with an error instead of a value: gid_attrs/types/<i> of an empty GID
    # slot or of an InfiniBand port (EINVAL), speed of a down interface (EINVAL).
    try:
        return path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None


def _read_int(path: Path) -> int | None:
    text = _read(path)
    try:
        return int(text, 0) if text is not None else None
    except ValueError:
        return None


def _link_name(path: Path) -> str | None:
    """Basename of a symlink's target (device/driver -> .../drivers/mlx5_core)."""
    try:
        return path.resolve(strict=True).name
    except OSError:
        return None


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve(strict=True) == b.resolve(strict=True)
    except OSError:
        return False


def _rdma_device(sysfs: Path, path: Path) -> RdmaDevice:
    netdevs = _netdevs_of(sysfs, path / "device")
    ports = tuple(_port(path.name, port_dir, netdevs) for port_dir in _entries(path / "ports"))
    return RdmaDevice(
        name=path.name,
        driver=_link_name(path / "device" / "driver"),
        pci_device_id=_read(path / "device" / "device"),
        ports=ports,
    )


def _netdevs_of(sysfs: Path, pci_device: Path) -> list[str]:
    """Interfaces on the same PCI function as an RDMA device: listed under its device/net/, and
    pointing back to it from /sys/class/net/<if>/device (both views of one kernel object)."""
    names = {p.name for p in _entries(pci_device / "net")}
    names.update(p.name for p in _entries(sysfs / "class" / "net") if _same_file(p / "device", pci_device))
    # Pkey children of IPoIB (ib0.8001) share the PCI function; the parent comes first.
    return sorted(names, key=lambda n: ("." in n, natural_key(n)))


def _port(device: str, port_dir: Path, netdevs: list[str]) -> RdmaPort:
    state_text = _read(port_dir / "state") or ""
    rate_text = _read(port_dir / "rate") or ""
    rate = re.match(r"([\d.]+) Gb/sec", rate_text)
    port_number = int(port_dir.name) if port_dir.name.isdigit() else 0
    gid = _roce_v2_ipv4_gid(port_dir)
    netdev = None
    if gid is not None:
        # RoCE GIDs are built from the addresses of one netdev, which sysfs names per GID.
        netdev = _read(port_dir / "gid_attrs" / "ndevs" / str(gid[0]))
    if netdev is None:
        netdev = _netdev_for_port(port_dir, port_number, netdevs)
    return RdmaPort(
        device=device,
        port=port_number,
        state=state_text.partition(":")[2].strip() or state_text,
        link_layer=_read(port_dir / "link_layer") or "",
        rate_gbps=float(rate.group(1)) if rate else None,
        netdev=netdev,
        roce_v2_gid_index=gid[0] if gid else None,
        roce_v2_ipv4=gid[1] if gid else None,
    )


def _netdev_for_port(port_dir: Path, port_number: int, netdevs: list[str]) -> str | None:
    if len(netdevs) <= 1:
        return netdevs[0] if netdevs else None
    # Dual-port HCAs with one PCI function (mlx4, ConnectX-3): dev_port numbers the ports from 0.
    net = port_dir.parent.parent / "device" / "net"
    for name in netdevs:
        if _read_int(net / name / "dev_port") == port_number - 1:
            return name
    return netdevs[0]


def _roce_v2_ipv4_gid(port_dir: Path) -> tuple[int, str] | None:
    """The GID index NCCL (2.21+, NCCL_IB_GID_INDEX=-1) would pick on RoCE: type "RoCE v2" and an
    IPv4-mapped address (::ffff:a.b.c.d), so the packets are routable UDP/IPv4. The same address also
    sits at another index as "IB/RoCE v1" (L2 only); mlx5 usually puts the v2 one at index 3."""
    indices = sorted(int(p.name) for p in _entries(port_dir / "gids") if p.name.isdigit())
    for index in indices:
        gid = _read(port_dir / "gids" / str(index))
        try:
            mapped = ipaddress.IPv6Address(gid or "").ipv4_mapped
        except ValueError:
            continue
        if mapped is None:
            continue
        # Exact compare: "IB/RoCE v1" also contains "RoCE v".
        if _read(port_dir / "gid_attrs" / "types" / str(index)) == "RoCE v2":
            return index, str(mapped)
    return None


def _interface(path: Path) -> NetInterface:
    speed = _read_int(path / "speed")
    return NetInterface(
        name=path.name,
        arp_type=_read_int(path / "type"),
        operstate=_read(path / "operstate") or "",
        # -1 (SPEED_UNKNOWN) from drivers that do not know, e.g. virtio or a bond without slaves.
        speed_mbps=speed if speed is not None and speed > 0 else None,
        enslaved=(path / "master").is_symlink() or (path / "master").exists(),
    )


def _ec2_instance_type(sysfs: Path) -> str | None:
    # Nitro instances put the instance type into the DMI product name.
    dmi = sysfs / "class" / "dmi" / "id"
    if _read(dmi / "sys_vendor") != "Amazon EC2":
        return None
    return _read(dmi / "product_name") or None


# --- choices derived from a NodeFabric ---------------------------------------------------------------


def in_namespace(fabric: NodeFabric, names: Collection[str]) -> NodeFabric:
    """Keep only the interfaces that exist in this process's network namespace (`names`, e.g. from
    socket.if_nameindex()). sysfs lists the interfaces of the namespace that mounted it, which need
    not be the rank's: a container with its own network, or a test cluster whose node namespaces
    share the host's /sys. Naming an interface the rank cannot see makes gloo fail at init."""
    return dataclasses.replace(fabric, interfaces=tuple(i for i in fabric.interfaces if i.name in names))


def auto_profile(fabric: NodeFabric) -> str:
    """What `auto` resolves to on this node: InfiniBand > RoCE > EFA > tcp."""
    if fabric.active_ib_ports:
        return "infiniband"
    if fabric.usable_roce_ports:
        return "roce"
    if fabric.active_efa_devices:
        return "efa"
    return "tcp"


def ethernet_interface(fabric: NodeFabric) -> str | None:
    """The Ethernet interface for sockets when no RDMA network provides one: up, not a container or
    libvirt bridge, not a bond slave (its bond holds the address); fastest first, then by name."""
    candidates = _usable_ethernet(fabric)
    return candidates[0].name if candidates else None


def _usable_ethernet(fabric: NodeFabric) -> list[NetInterface]:
    usable = [
        i
        for i in fabric.interfaces
        if i.up and i.arp_type == ARPHRD_ETHER and not i.skipped and not i.enslaved
    ]
    return sorted(usable, key=lambda i: (-(i.speed_mbps or 0), natural_key(i.name)))


def ipoib_interface(fabric: NodeFabric) -> str | None:
    """The IPoIB interface of the first active InfiniBand port whose interface is up."""
    for port in fabric.active_ib_ports:
        iface = fabric.interface(port.netdev)
        if iface is not None and iface.up and iface.arp_type == ARPHRD_INFINIBAND:
            return iface.name
    others = [i for i in fabric.interfaces if i.up and i.arp_type == ARPHRD_INFINIBAND and not i.skipped]
    return others[0].name if others else None


def efa_device_rdma(fabric: NodeFabric) -> bool:
    """Whether this node's EFA does RDMA read, as far as sysfs can tell (see EFA_RDMA_*)."""
    ids = [_hex(d.pci_device_id) for d in fabric.efa_devices]
    if ids and all(i is not None and i >= EFA_RDMA_MIN_DEVICE_ID for i in ids):
        return True
    family = (fabric.instance_type or "").split(".")[0]
    return bool(ids) and family in EFA_RDMA_INSTANCE_FAMILIES


def _hex(text: str | None) -> int | None:
    try:
        return int(text, 16) if text else None
    except ValueError:
        return None


# --- environment per profile -----------------------------------------------------------------------


def nccl_env(fabric: NodeFabric, profile: str, user_env: Mapping[str, str]) -> dict[str, str]:
    """The variables a rank on this node should get: the profile's settings, then `user_env` on top.

    Raises ConfigError for an unknown profile, for a profile whose hardware this node lacks, and for
    an NCCL_IB_HCA in `user_env` that names an HCA (or port) the node does not have.
    """
    if profile not in PROFILES:
        valid = ", ".join(PROFILES)
        raise ConfigError(f"fabric.profile: unknown profile {profile!r}; valid profiles: {valid}")
    if profile == "none":
        return dict(user_env)
    if "NCCL_IB_HCA" in user_env:
        check_hca_list(fabric, user_env["NCCL_IB_HCA"])
    chosen = auto_profile(fabric) if profile == "auto" else profile
    derived = {**_PROFILE_ENV[chosen](fabric), **TORCH_WATCHDOG}
    return {**derived, **user_env}


def _infiniband_env(fabric: NodeFabric) -> dict[str, str]:
    ports = fabric.active_ib_ports
    if not ports:
        raise ConfigError(
            f"fabric.profile: infiniband, but this node has no active InfiniBand port; found: "
            f"{describe(fabric)}. Use profile auto or tcp, or ask the admins to check the HCAs (ibstat)."
        )
    # Bootstrap and NCCL's out-of-band IB setup go over IPoIB when it is up: it is the network every
    # node of an IB fabric shares (NCCL's own interface choice favours ib* for the same reason), while
    # a management Ethernet may be a separate, slower or NAT'ed network. sysfs cannot show whether the
    # interface has an address: a node with IPoIB up but unaddressed needs NCCL_SOCKET_IFNAME and
    # GLOO_SOCKET_IFNAME in fabric.env.
    iface = ipoib_interface(fabric) or ethernet_interface(fabric)
    return {**_hca_env(ports), **_socket_env(iface)}


def _roce_env(fabric: NodeFabric) -> dict[str, str]:
    ports = fabric.usable_roce_ports
    if not ports:
        active = [p for p in fabric.roce_ports if p.active]
        reason = (
            f"its active RoCE ports ({', '.join(p.hca_spec for p in active)}) have no RoCE v2 GID with "
            "an IPv4 address: give their interfaces an IPv4 address"
            if active
            else "it has no active RoCE port"
        )
        raise ConfigError(f"fabric.profile: roce, but {reason}; found: {describe(fabric)}.")
    env = _hca_env(ports)
    indices = {p.roce_v2_gid_index for p in ports}
    if len(indices) == 1:
        # NCCL before 2.21 defaults to GID 0 (RoCE v1, link-local, not routable); 2.21+ finds the same
        # index itself. With different indices per port one value would be wrong for some port, so
        # then NCCL is left to choose per port.
        env["NCCL_IB_GID_INDEX"] = str(indices.pop())
    # The RoCE interface is known to have an IPv4 address (its GID is built from it).
    return {**env, **_socket_env(ports[0].netdev)}


def _efa_env(fabric: NodeFabric) -> dict[str, str]:
    if not fabric.efa_devices:
        raise ConfigError(f"fabric.profile: efa, but this node has no EFA device; found: {describe(fabric)}.")
    env = {
        # Without this libfabric may pick another provider (tcp, shm) and NCCL still "works", slowly.
        "FI_PROVIDER": "efa",
        # NCCL needs the aws-ofi-nccl plugin to use EFA; without it NCCL silently falls back to TCP on
        # the ENA interface, several times slower. Naming the plugin turns that into an immediate
        # "network AWS Libfabric not found". Opt out with fabric.env NCCL_NET or profile tcp.
        "NCCL_NET": AWS_OFI_NCCL_NET,
    }
    if efa_device_rdma(fabric):
        # GPUDirect RDMA through the EFA. Set only where the device does RDMA read: on one that does
        # not (first-generation EFA, g5), libfabric aborts the process when this is 1.
        env["FI_EFA_USE_DEVICE_RDMA"] = "1"
    # NCCL_PROTO stays unset: aws-ofi-nccl sets NCCL_PROTO=simple itself where LL/LL128 could corrupt
    # data on the platform at hand, and leaves it off where they are safe (P5 with RDMA); see
    # aws/aws-ofi-nccl PRs #280 and #850 and its log line "NET/OFI Setting NCCL_PROTO to "simple"".
    # A value set here would override that per-platform choice. Only plugins <= 1.5 needed it from the
    # user. FI_EFA_FORK_SAFE is left to libfabric/the plugin as well; set it in fabric.env if needed.
    return {**env, **_socket_env(ethernet_interface(fabric))}


def _tcp_env(fabric: NodeFabric) -> dict[str, str]:
    env = {
        "NCCL_IB_DISABLE": "1",
        # NCCL_IB_DISABLE only turns off NCCL's built-in verbs transport; an installed net plugin
        # (aws-ofi-nccl, HPC-X's) would still be picked first. NCCL_NET forces the socket transport.
        "NCCL_NET": "Socket",
    }
    # No interface at all (a laptop, a container with only lo): NCCL and Gloo fall back to loopback,
    # which is what a single-node run needs.
    return {**env, **_socket_env(ethernet_interface(fabric))}


_PROFILE_ENV: dict[str, Callable[[NodeFabric], dict[str, str]]] = {
    "infiniband": _infiniband_env,
    "roce": _roce_env,
    "efa": _efa_env,
    "tcp": _tcp_env,
}


def _hca_env(ports: tuple[RdmaPort, ...]) -> dict[str, str]:
    return {
        # NCCL reads a leading "=" as "every token is an exact device name"; without it each token is
        # a prefix, so mlx5_1 would also select mlx5_10..mlx5_19. Listing only ACTIVE ports (and only
        # ports of this link layer) keeps NCCL off down ports and off the Ethernet storage NICs that
        # e.g. a DGX H100 has next to its InfiniBand ones.
        "NCCL_IB_HCA": "=" + ",".join(p.hca_spec for p in ports),
        "NCCL_IB_TIMEOUT": IB_TIMEOUT,
        "NCCL_IB_RETRY_CNT": IB_RETRY_CNT,
    }


def _socket_env(iface: str | None) -> dict[str, str]:
    if iface is None:
        return {}
    return {
        # NCCL: "=" for the exact name, as above (eth1 would also match eth10).
        "NCCL_SOCKET_IFNAME": "=" + iface,
        # Gloo takes exact interface names, comma-separated, no prefix syntax.
        "GLOO_SOCKET_IFNAME": iface,
    }


def check_hca_list(fabric: NodeFabric, value: str) -> None:
    """Reject an NCCL_IB_HCA value naming an HCA or port this node does not have.

    The syntax is NCCL's: an optional "^" (exclude the list), then an optional "=" (exact names instead
    of prefixes), then comma-separated device[:port] tokens. A misspelt name is never an error inside
    NCCL: it just selects nothing (or excludes nothing), and the job runs on another transport.
    """
    spec = value.strip()
    exclude = spec.startswith("^")
    spec = spec.removeprefix("^")
    exact = spec.startswith("=")
    spec = spec.removeprefix("=")
    names = ", ".join(d.name for d in fabric.devices) or "none"
    for token in (t.strip() for t in spec.split(",")):
        if not token:
            continue
        name, _, port = token.partition(":")
        matches = [d for d in fabric.devices if (d.name == name if exact else d.name.startswith(name))]
        if not matches:
            what = "HCA" if exact else "HCA whose name starts with"
            raise ConfigError(
                f"fabric.env: NCCL_IB_HCA={value!r} {'excludes' if exclude else 'names'} {name!r}, but "
                f"this node has no {what} {name!r}; its RDMA devices are: {names}"
            )
        if port and not any(p.port == _port_number(port, value) for d in matches for p in d.ports):
            ports = ", ".join(p.hca_spec for d in matches for p in d.ports) or "no ports"
            raise ConfigError(
                f"fabric.env: NCCL_IB_HCA={value!r} names port {token!r}, which this node does not "
                f"have; {name!r} has: {ports}"
            )


def _port_number(text: str, value: str) -> int:
    if not text.isdigit():
        raise ConfigError(f"fabric.env: NCCL_IB_HCA={value!r}: port {text!r} is not a number")
    return int(text)


# --- summary for logs ------------------------------------------------------------------------------


def describe(fabric: NodeFabric) -> str:
    """One line for the job log, e.g. "8 InfiniBand HCAs (7 active; mlx5_3 port 1 DOWN), 400 Gb/s,
    IPoIB ibp24s0; Ethernet up: eno3 10 Gb/s"."""
    parts = [
        part
        for part in (_describe_ib(fabric), _describe_roce(fabric), _describe_efa(fabric))
        if part is not None
    ]
    if not parts:
        parts.append("no RDMA devices")
    parts.append(_describe_ethernet(fabric))
    return "; ".join(parts)


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def _rates(ports: tuple[RdmaPort, ...]) -> str | None:
    rates = sorted({p.rate_gbps for p in ports if p.active and p.rate_gbps is not None})
    return "/".join(f"{r:g}" for r in rates) + " Gb/s" if rates else None


def _not_active(ports: tuple[RdmaPort, ...]) -> list[str]:
    return [f"{p.device} port {p.port} {p.state or 'state unknown'}" for p in ports if not p.active]


def _describe_ib(fabric: NodeFabric) -> str | None:
    ports = fabric.ib_ports
    if not ports:
        return None
    hcas = {p.device for p in ports}
    status = "; ".join([f"{len(fabric.active_ib_ports)} active", *_not_active(ports)])
    ipoib = ipoib_interface(fabric)
    details = [_rates(ports), f"IPoIB {ipoib}" if ipoib else "no IPoIB interface up"]
    return ", ".join([f"{_plural(len(hcas), 'InfiniBand HCA')} ({status})", *filter(None, details)])


def _describe_roce(fabric: NodeFabric) -> str | None:
    ports = fabric.roce_ports
    if not ports:
        return None
    active = tuple(p for p in ports if p.active)
    status = [f"{len(active)} active", *_not_active(ports)]
    status += [f"{p.hca_spec} has no IPv4 RoCE v2 GID" for p in active if p.roce_v2_gid_index is None]
    indices = sorted({p.roce_v2_gid_index for p in active if p.roce_v2_gid_index is not None})
    if indices:
        status.append("RoCE v2 GID " + "/".join(map(str, indices)))
    netdevs = "/".join(p.netdev for p in active if p.netdev)
    details = [_rates(ports), f"interfaces {netdevs}" if netdevs else None]
    return ", ".join([f"{_plural(len(ports), 'RoCE port')} ({'; '.join(status)})", *filter(None, details)])


def _describe_efa(fabric: NodeFabric) -> str | None:
    devices = fabric.efa_devices
    if not devices:
        return None
    ports = tuple(p for d in devices for p in d.ports)
    rdma = "on" if efa_device_rdma(fabric) else "off"
    where = f" ({fabric.instance_type})" if fabric.instance_type else ""
    details = [_rates(ports), f"device RDMA {rdma}{where}"]
    head = f"{_plural(len(devices), 'EFA device')} ({len(fabric.active_efa_devices)} active)"
    return ", ".join([head, *filter(None, details)])


def _describe_ethernet(fabric: NodeFabric) -> str:
    up = _usable_ethernet(fabric)
    if not up:
        return "no Ethernet interface up"
    return "Ethernet up: " + ", ".join(
        f"{i.name} {i.speed_mbps / 1000:g} Gb/s" if i.speed_mbps else i.name for i in up
    )
