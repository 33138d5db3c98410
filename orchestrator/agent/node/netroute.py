"""Which network interface a node's collectives must use, found on the node.

Left to themselves Gloo and NCCL often pick wrong: Gloo binds the address
the host name resolves to (``127.0.1.1`` on Debian and Ubuntu: loopback);
NCCL may pick ``docker0``, the same address on every host; and the cluster
NIC's name differs between hosts, so no one name fits. So each node takes
the interface through which it reaches the rendezvous, as the kernel's
routing table chooses for the real traffic.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import struct

# rtnetlink (linux/rtnetlink.h, linux/if_addr.h)
_RTM_GETADDR, _NLM_F_REQUEST, _NLM_F_DUMP = 22, 0x1, 0x300
_NLMSG_DONE, _NLMSG_ERROR, _RTM_NEWADDR = 3, 2, 20
_IFA_ADDRESS, _IFA_LOCAL = 1, 2


def addresses() -> list[tuple[str, str]]:
    """Every (interface name, address) here, from rtnetlink; link-local ones lack ``%scope``."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE) as sock:
        sock.settimeout(5.0)
        request = struct.pack("=LHHLL", 16 + 8, _RTM_GETADDR, _NLM_F_REQUEST | _NLM_F_DUMP, 1, 0)
        sock.send(request + struct.pack("=BBBBL", socket.AF_UNSPEC, 0, 0, 0, 0))
        found: dict[tuple[int, str], None] = {}
        while True:
            data = sock.recv(65536)
            offset = 0
            while offset + 16 <= len(data):
                length, kind, _flags, _seq, _pid = struct.unpack_from("=LHHLL", data, offset)
                if length < 16 or kind == _NLMSG_DONE:
                    return _named(found)
                if kind == _NLMSG_ERROR:
                    raise OSError("the kernel refused to list its addresses (rtnetlink)")
                if kind == _RTM_NEWADDR:
                    found.update(dict.fromkeys(_parse_addr(data[offset + 16:offset + length])))
                offset += (length + 3) & ~3


def _parse_addr(body: bytes) -> list[tuple[int, str]]:
    family, _prefix, _flags, _scope, index = struct.unpack_from("=BBBBL", body)
    size = 4 if family == socket.AF_INET else 16 if family == socket.AF_INET6 else 0
    out, offset = [], 8
    local = None
    while size and offset + 4 <= len(body):
        length, kind = struct.unpack_from("=HH", body, offset)
        if length < 4:
            break
        if kind in (_IFA_ADDRESS, _IFA_LOCAL) and length - 4 == size:
            text = socket.inet_ntop(family, body[offset + 4:offset + 4 + size])
            if kind == _IFA_LOCAL:
                local = text  # on a point-to-point link IFA_ADDRESS is the peer's
            elif text not in out:
                out.append(text)
        offset += (length + 3) & ~3
    return [(index, local)] if local else [(index, a) for a in out]


def _named(found: dict[tuple[int, str], None]) -> list[tuple[str, str]]:
    out = []
    for index, addr in found:
        try:
            out.append((socket.if_indextoname(index), addr))
        except OSError:
            continue  # the interface went away while we looked
    return out


def interfaces() -> list[str]:
    return [name for _index, name in socket.if_nameindex()]


def source_address(host: str, port: int) -> str:
    """The local address the kernel would send from to reach ``host``."""
    family, _type, _proto, _name, target = socket.getaddrinfo(
        host, port, 0, socket.SOCK_DGRAM)[0]
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        sock.connect(target)  # UDP: nothing is sent, only a route is chosen
        return sock.getsockname()[0].split("%", 1)[0]


def is_loopback(addr: str) -> bool:
    try:
        return ipaddress.ip_address(addr.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def _facing_peers(addr: str, via: str) -> tuple[str, str]:
    """This node's address for peers elsewhere when the rendezvous is
    loopback here: the controller's way in, else the default route's source."""
    reached = os.environ.get("SSH_CONNECTION", "").split()
    if len(reached) == 4 and not is_loopback(reached[2]):
        return reached[2].split("%", 1)[0], "the address this host was reached on"
    try:
        probe = "2001:db8::1" if ":" in addr else "192.0.2.1"
        found = source_address(probe, 9)
    except OSError:
        return addr, via
    return (found, "the default route") if not is_loopback(found) else (addr, via)


def route(host: str, port: int, remote_peers: bool) -> dict:
    """The interface and address reaching ``host:port``; not loopback with ``remote_peers``."""
    names = interfaces()
    try:
        table = addresses()
    except OSError as exc:
        return {"ok": False, "error": f"cannot list this host's addresses: {exc}",
                "interfaces": names}
    try:
        addr, via = source_address(host, port), f"the route to {host}"
    except OSError as exc:
        return {"ok": False, "error": f"no route to {host} from this host: "
                                      f"{exc.strerror or exc}", "interfaces": names}
    if is_loopback(addr) and remote_peers:
        addr, via = _facing_peers(addr, via)
    owners = [name for name, a in table if a == addr]
    if not owners:
        return {"ok": False, "error": f"no interface holds {addr} ({via})", "interfaces": names}
    out = {"ok": True, "ifname": owners[0], "addr": addr, "via": via,
           "loopback": is_loopback(addr), "interfaces": names}
    speed = link_speed(owners[0])
    if speed is not None:
        out["speed"] = speed
    faster = faster_link(owners[0], table)
    if faster is not None:
        out["faster"] = faster
    return out


SYS_NET = "/sys/class/net"
MUCH_FASTER = 4  # another link this many times as fast as the chosen one is said


def link_speed(name: str) -> int | None:
    """``name``'s link speed in Mb/s, or None (a bridge, a virtual link, a link down)."""
    try:
        with open(os.path.join(SYS_NET, name, "speed"), encoding="ascii") as fh:
            speed = int(fh.read().strip())
    except (OSError, ValueError):
        return None
    return speed if speed > 0 else None


def faster_link(chosen: str, table: "list[tuple[str, str]]") -> dict | None:
    """The fastest other usable interface, at least ``MUCH_FASTER`` times as
    fast as ``chosen``, or None: the route to the master often picks a lab
    box's 1 GbE management link beside the data NIC."""
    mine = link_speed(chosen)
    if mine is None:
        return None
    best = None
    for name, addr in table:
        if name == chosen or is_loopback(addr) or addr.lower().startswith("fe80:"):
            continue
        try:
            with open(os.path.join(SYS_NET, name, "operstate"), encoding="ascii") as fh:
                up = fh.read().strip() == "up"
        except OSError:
            up = False
        speed = link_speed(name) if up else None
        if speed is not None and speed >= MUCH_FASTER * mine and \
                (best is None or speed > best["speed"]):
            best = {"ifname": name, "addr": addr, "speed": speed}
    return best
