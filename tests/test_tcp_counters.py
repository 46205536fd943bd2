"""odsgd.bench.tcp_counters: the parsing of /proc's TCP statistics and of `tc -s qdisc`, checked
against traffic this test makes and against written-out tc output (closed forms)."""
import os
import socket

import pytest

from odsgd.bench import tcp_counters

TC_OUTPUT = """\
qdisc tbf 8001: root refcnt 2 rate 156250Kbit burst 66036b lat 100ms
 Sent 120400 bytes 80 pkt (dropped 7, overlimits 31 requeues 0)
 backlog 0b 0p requeues 0
qdisc tbf 8002: parent 1: rate 10Mbit burst 66036b lat 100ms
 Sent 5 bytes 1 pkt (dropped 12, overlimits 0 requeues 0)
 backlog 0b 0p requeues 0
"""


def test_qdisc_drops_are_summed_over_every_qdisc():
    assert tcp_counters.parse_qdisc_drops(TC_OUTPUT) == 7 + 12
    assert tcp_counters.parse_qdisc_drops("qdisc noqueue 0: root refcnt 2\n") == 0


@pytest.mark.timeout(30)
def test_segments_sent_over_loopback_show_in_the_namespaces_counters():
    """2 MB sent to ourselves over TCP on lo (MTU 65536): at least 2 MB / 64 KiB = 31
    segments more in Tcp: OutSegs; every counter is read and none goes down."""
    before = tcp_counters.tcp_counters(os.getpid())
    assert set(before) == {ours for _, _, _, ours in tcp_counters.TCP_COUNTERS}
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    client = socket.create_connection(server.getsockname())
    peer, _ = server.accept()
    client.sendall(b"x" * 2000000)
    got = 0
    while got < 2000000:
        got += len(peer.recv(1 << 20))
    for s in (client, peer, server):
        s.close()
    change = tcp_counters.difference(before, tcp_counters.tcp_counters(os.getpid()))
    assert change["segments_sent"] >= 2000000 // 65536
    assert all(value >= 0 for value in change.values())


def test_per_step_and_summary_line():
    counts = {"segments_sent": 300, "retransmitted_segments": 9, "retransmission_timeouts": 3,
              "tail_loss_probes": 0, "drops_sending": 0, "drops_receiving": 6,
              "drops_receiving_first_host": 6}
    steps = tcp_counters.per_step(counts, 3)
    assert steps["retransmission_timeouts"] == 1.0 and steps["drops_receiving"] == 2.0
    assert "1.00 retransmission timeouts" in tcp_counters.summary_line(steps)


def test_proc_counters_are_read_by_section_and_unpaired_lines_refused():
    text = "Ip: Forwarding InReceives\nIp: 2 17\nTcp: OutSegs RetransSegs\nTcp: 40 3\n"
    assert tcp_counters.parse_proc_counters(text) == {
        "Ip": {"Forwarding": 2, "InReceives": 17}, "Tcp": {"OutSegs": 40, "RetransSegs": 3}}
    with pytest.raises(ValueError, match="unpaired"):
        tcp_counters.parse_proc_counters("Tcp: A B\nUdp: 1 2\n")


def test_counting_without_a_cluster_counts_nothing():
    """A job not on emulated hosts (no cluster): counting yields None and reads nothing (a
    snapshot of None would fail on its hosts)."""
    with tcp_counters.counting(None, 10) as counts:
        pass
    assert counts is None
