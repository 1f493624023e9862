"""Separate hosts on this machine: Linux network namespaces, each with its own network stack and
one address on a bridge in the host's namespace (10.231.0.0/24 by default; the host is .1). A
process started with `Hosts.prefix(name)` sees only its own namespace: its loopback is its own, the
other hosts and the host's services bound to the bridge address are reached over the bridge, and
no host name resolves to any of them. Needs root and iproute2 (`available()` says whether this
machine has them); everything made is removed on `close()`."""

from __future__ import annotations

import os
import shutil
import subprocess


def available() -> str | None:
    """None when namespaces can be made here, else why not."""
    if os.geteuid() != 0:
        return "not root"
    if shutil.which("ip") is None:
        return "no `ip` (iproute2)"
    return None


class Hosts:
    """Hosts on one bridge; `add(name)` returns the host's address."""

    def __init__(self, subnet: str = "10.231.0") -> None:
        self.subnet = subnet
        self.tag = f"sl{os.getpid() % 100000}"  # interface names have at most 15 characters
        self.bridge = f"{self.tag}br"
        self.host_ip = f"{subnet}.1"
        self.hosts: dict[str, str] = {}
        self._ip("link", "add", self.bridge, "type", "bridge")
        try:
            self._ip("addr", "add", f"{self.host_ip}/24", "dev", self.bridge)
            self._ip("link", "set", self.bridge, "up")
        except subprocess.CalledProcessError:
            self.close()
            raise

    @staticmethod
    def _ip(*args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True, text=True)

    def _ns(self, name: str) -> str:
        return f"{self.tag}-{name}"

    def add(self, name: str) -> str:
        ip = f"{self.subnet}.{len(self.hosts) + 2}"
        ns, veth = self._ns(name), f"{self.tag}v{len(self.hosts)}"
        self.hosts[name] = ip
        self._ip("netns", "add", ns)
        self._ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        self._ip("link", "set", veth, "master", self.bridge, "up")
        self._ip("-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0")
        self._ip("-n", ns, "link", "set", "eth0", "up")
        self._ip("-n", ns, "link", "set", "lo", "up")
        return ip

    def prefix(self, name: str) -> list[str]:
        """The command prefix that runs a program on host `name`."""
        return ["ip", "netns", "exec", self._ns(name)]

    def close(self) -> None:
        for name in self.hosts:
            subprocess.run(["ip", "netns", "del", self._ns(name)], capture_output=True)  # its veth goes with it
        self.hosts.clear()
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)

    def __enter__(self) -> Hosts:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
