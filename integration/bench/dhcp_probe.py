#!/usr/bin/env python3
"""A DHCP probe with 10 ms resolution, for the fleet benchmark (integration/benches/fleet.rs).

Real clients retry after a second or more, which would hide how fast a failover or a change
really is. This probe runs inside a VM's network namespace, bound to its interface, and takes
one command per line on stdin:

    discover MAC                  until an OFFER for MAC arrives
    request MAC IP [DNS]          INIT-REBOOT REQUEST for IP until an ACK (whose option 6
                                  starts with DNS, when given) arrives

It sends a fresh transaction every 10 ms (broadcast flag set, so replies are broadcast) and
prints, per command, `ok SECONDS` (time from reading the command to the matching reply) or
`timeout`. Usage: dhcp_probe.py IFACE [TIMEOUT_SECONDS]
"""

import os
import select
import socket
import struct
import sys
import time

MAGIC = bytes([99, 130, 83, 99])
INTERVAL = 0.01


def packet(kind, mac, xid, ip=None):
    chaddr = bytes.fromhex(mac.replace(":", "")).ljust(16, b"\0")
    head = struct.pack("!BBBBIHH4s4s4s4s16s", 1, 1, 6, 0, xid, 0, 0x8000,
                       bytes(4), bytes(4), bytes(4), bytes(4), chaddr)
    opts = bytes([53, 1, kind])
    if ip:
        opts += bytes([50, 4]) + socket.inet_aton(ip)
    opts += bytes([55, 4, 1, 3, 6, 51, 255])
    return head + bytes(192) + MAGIC + opts


def options(data):
    out = {}
    i = 240
    while i < len(data) and data[i] != 255:
        if data[i] == 0:
            i += 1
            continue
        if i + 1 >= len(data):
            break
        code, size = data[i], data[i + 1]
        out[code] = data[i + 2:i + 2 + size]
        i += 2 + size
    return out


def run(sock, words, limit):
    kind, want = (1, 2) if words[0] == "discover" else (3, 5)
    mac = words[1]
    ip = words[2] if len(words) > 2 else None
    dns = socket.inet_aton(words[3]) if len(words) > 3 else None
    chaddr = bytes.fromhex(mac.replace(":", ""))
    start = time.monotonic()
    sent = set()
    next_send = start
    while True:
        now = time.monotonic()
        if now - start > limit:
            return "timeout"
        if now >= next_send:
            xid = int.from_bytes(os.urandom(4), "big")
            sent.add(xid)
            sock.sendto(packet(kind, mac, xid, ip), ("255.255.255.255", 67))
            next_send = now + INTERVAL
        ready, _, _ = select.select([sock], [], [], max(0.0, next_send - time.monotonic()))
        if not ready:
            continue
        data = sock.recv(4096)
        if len(data) < 244 or data[0] != 2 or data[28:34] != chaddr:
            continue
        if struct.unpack("!I", data[4:8])[0] not in sent:
            continue
        opts = options(data)
        if opts.get(53) != bytes([want]):
            continue
        if dns is not None and not opts.get(6, b"").startswith(dns):
            continue
        return "ok %.4f" % (time.monotonic() - start)


def main():
    iface = sys.argv[1]
    limit = float(sys.argv[2]) if len(sys.argv) > 2 else 30.0
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, iface.encode())
    sock.bind(("0.0.0.0", 68))
    print("ready", flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        while select.select([sock], [], [], 0)[0]:
            sock.recv(4096)
        print(run(sock, words, limit), flush=True)


if __name__ == "__main__":
    main()
