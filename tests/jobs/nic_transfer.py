"""Timed TCP transfers between emulated hosts (tests/test_emulated_cluster.py), to measure what
the shaped NICs let through.

    nic_transfer.py receive ADDRESS PORT SENDERS BYTES   prints the seconds from the first byte
                                                         to the last of every sender's BYTES
    nic_transfer.py send ADDRESS PORT BYTES              sends BYTES to the receiver"""
import socket
import sys
import threading
import time

CHUNK = 1 << 16


def receive(address, port, senders, size):
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((address, port))
    server.listen(senders)
    print("listening", flush=True)
    first, done = [], []

    def drain(connection):
        got = 0
        while got < size:
            data = connection.recv(CHUNK)
            if not data:
                raise RuntimeError("sender closed after %d of %d bytes" % (got, size))
            if not first:
                first.append(time.time())
            got += len(data)
        done.append(time.time())
        connection.close()
    threads = []
    for _ in range(senders):
        connection, _ = server.accept()
        thread = threading.Thread(target=drain, args=(connection,))
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join()
    print("seconds %.6f" % (max(done) - first[0]), flush=True)


def send(address, port, size):
    connection = socket.create_connection((address, port), timeout=60)
    block = b"\0" * CHUNK
    sent = 0
    while sent < size:
        sent += connection.send(block[:min(CHUNK, size - sent)])
    connection.shutdown(socket.SHUT_WR)
    connection.recv(1)
    connection.close()


if __name__ == "__main__":
    if sys.argv[1] == "receive":
        receive(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
    else:
        send(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
