"""Both ends of one TCP connection on loopback, sending prepared bytes: run under the
in-process recorder's library by tests/test_wiretap.py.

Usage: python wiretap_peer.py SPEC.json.  The spec has ``port`` (the server's,
a port the recorder follows) and ``client``/``server``: lists of
``[how, hex]`` pieces, sent in order (all the client's, then all the
server's) with ``how`` one of ``send`` (socket.sendall), ``sendmsg`` (the
piece cut in three buffers), ``write`` (os.write) and ``writev`` (os.writev,
three buffers); ``spawn`` (run a program, which closes its copies of every
descriptor: Python spawns with vfork where it can) and ``fork`` (a child that
exits at once) send nothing.  With ``"client_in_child": true`` the client
end lives in a forked child process; with ``"dual_stack": true`` the server
listens on an IPv6 socket on [::] (the IPv4 client's connection reaches it as
::ffff:127.0.0.1).  Each side reads what the other sends, so no buffer fills.
Imports nothing from tf_grpc_bench: the library sees plain system calls.
"""

import json
import os
import socket
import subprocess
import sys
import threading


def drain(sock: socket.socket, expected: int) -> None:
    received = 0
    while received < expected:
        chunk = sock.recv(1 << 16)
        if not chunk:
            return
        received += len(chunk)


def thirds(data: bytes) -> list[bytes]:
    third = max(1, len(data) // 3)
    return [data[:third], data[third : 2 * third], data[2 * third :]]


def send_piece(sock: socket.socket, how: str, data: bytes) -> None:
    view = memoryview(data)
    if how == "send":
        sock.sendall(data)
    elif how == "sendmsg":
        sent = sock.sendmsg(thirds(data))
        if sent < len(data):
            sock.sendall(view[sent:])
    elif how == "write":
        while view:
            view = view[os.write(sock.fileno(), view) :]
    elif how == "writev":
        sent = os.writev(sock.fileno(), thirds(data))
        if sent < len(data):
            sock.sendall(view[sent:])
    elif how == "spawn":
        subprocess.run(["true"], check=True, close_fds=True)
    elif how == "fork":
        child = os.fork()
        if not child:
            os._exit(0)
        os.waitpid(child, 0)
    else:
        raise SystemExit(f"unknown way to send: {how}")


def main() -> None:
    with open(sys.argv[1], encoding="utf-8") as handle:
        spec = json.load(handle)
    if spec.get("dual_stack"):  # an IPv6 socket on [::], as gRPC's servers listen
        listener = socket.socket(socket.AF_INET6)
        listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("::", spec["port"]))
    else:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", spec["port"]))
    listener.listen(1)
    pieces = {
        side: [(how, bytes.fromhex(data)) for how, data in spec[side]]
        for side in ("client", "server")
    }
    totals = {side: sum(len(data) for _, data in pieces[side]) for side in pieces}
    if spec.get("client_in_child"):
        child = os.fork()
        if not child:
            client = socket.create_connection(("127.0.0.1", spec["port"]))
            for how, data in pieces["client"]:
                send_piece(client, how, data)
            drain(client, totals["server"])
            client.close()
            os._exit(0)
        server, _ = listener.accept()
        drain(server, totals["client"])
        for how, data in pieces["server"]:
            send_piece(server, how, data)
        _, status = os.waitpid(child, 0)
        server.close()
        listener.close()
        if status:
            raise SystemExit(f"the client child failed: {status}")
        return
    client = socket.create_connection(("127.0.0.1", spec["port"]))
    client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    server, _ = listener.accept()
    for sender, receiver, side in ((client, server, "client"), (server, client, "server")):
        reader = threading.Thread(target=drain, args=(receiver, totals[side]))
        reader.start()
        for how, data in pieces[side]:
            send_piece(sender, how, data)
        reader.join()
    client.close()
    server.close()
    listener.close()


if __name__ == "__main__":
    main()
