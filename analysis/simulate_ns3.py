"""The replay's network on ns-3 (PyPI's `ns3` wheel, 3.44, cppyy bindings): packet-level TCP.

Every node is an ns-3 node on a star: a point-to-point link to one switch node (an IPv4 router), sending at
the node's up rate and receiving at its down rate (its host's limit when lower: not shared by both ways, as
SimGrid's host link is), with half the one-way latency, a drop-tail queue of QUEUE_S at the rate as a switch
port's buffer. Each direction of a pair of nodes gets one TCP connection
(ns-3's default TCP: CUBIC, MSS 1448 as at MTU 1500 with timestamps, delayed ACKs; Linux's timers: a least
retransmission timeout of 200 ms, acknowledgements delayed 40 ms at most), opened when its first
message leaves; a message is that many bytes written to it, delivered when its last byte is read at the other
end. The transport (sockets, callbacks, the event loop's stops) is C++ compiled once per process through
cppyy; ns is imported here only, when a simulation runs (its first import takes several seconds).
"""
from __future__ import annotations

from collections.abc import Callable

from dlcsniff.analysis.simulate_network import Links
from dlcsniff.analysis.simulate_replay import ReplayError

QUEUE_S = 0.02                     # the switch port's buffer, in time at the link's rate
UNTIL_END = 1e300
TRANSPORT = r"""
#include <algorithm>
#include <deque>
#include <map>
#include <sstream>
#include <vector>
namespace dlcsniff_ns3 {
using namespace ns3;
static void StopNow() { Simulator::Stop(); }
using Pair = std::pair<uint32_t, uint32_t>;

class Transport {
 public:
  std::vector<int64_t> done_ids;
  std::vector<double> done_times;

  Transport(const std::vector<double>& up_bit_s, const std::vector<double>& down_bit_s, double latency_s,
            double queue_s) {
    uint32_t n = up_bit_s.size();
    Config::SetDefault("ns3::TcpSocket::SegmentSize", UintegerValue(1448));
    Config::SetDefault("ns3::TcpSocket::SndBufSize", UintegerValue(4 << 20));
    Config::SetDefault("ns3::TcpSocket::RcvBufSize", UintegerValue(4 << 20));
    // Linux's timers, as the captured hosts ran: its least retransmission timeout (TCP_RTO_MIN, 200 ms; ns-3's
    // is 1 s) and its delayed acknowledgement's (TCP_DELACK_MIN, 40 ms; ns-3's 200 ms would now fire the RTO)
    Config::SetDefault("ns3::TcpSocketBase::MinRto", TimeValue(MilliSeconds(200)));
    Config::SetDefault("ns3::TcpSocket::DelAckTimeout", TimeValue(MilliSeconds(40)));
    m_hosts.Create(n);
    m_switch.Create(1);
    std::vector<NetDeviceContainer> links;
    for (uint32_t i = 0; i < n; ++i) {
      PointToPointHelper link;
      link.SetChannelAttribute("Delay", TimeValue(Seconds(latency_s / 2)));
      uint32_t packets = std::max<uint32_t>(16, (uint32_t) (std::max(up_bit_s[i], down_bit_s[i]) * queue_s / 8 / 1500));
      link.SetQueue("ns3::DropTailQueue", "MaxSize", QueueSizeValue(QueueSize(std::to_string(packets) + "p")));
      NetDeviceContainer devices = link.Install(m_hosts.Get(i), m_switch.Get(0));
      // each end of the point-to-point link sends at its own rate: the host's up, the switch port's down
      devices.Get(0)->SetAttribute("DataRate", DataRateValue(DataRate((uint64_t) up_bit_s[i])));
      devices.Get(1)->SetAttribute("DataRate", DataRateValue(DataRate((uint64_t) down_bit_s[i])));
      links.push_back(devices);
    }
    InternetStackHelper stack;
    stack.Install(m_hosts);
    stack.Install(m_switch);
    Ipv4AddressHelper address;
    for (uint32_t i = 0; i < n; ++i) {
      std::ostringstream net;
      net << "10." << (i / 250) << "." << (i % 250) << ".0";
      address.SetBase(net.str().c_str(), "255.255.255.0");
      m_addresses.push_back(address.Assign(links[i]).GetAddress(0));
    }
    Ipv4GlobalRoutingHelper::PopulateRoutingTables();
  }

  double Now() { return Simulator::Now().GetSeconds(); }

  void Start(int64_t id, uint32_t src, uint32_t dst, uint64_t bytes) {
    Pair key(src, dst);
    if (!m_senders.count(key)) Connect(key);
    bytes = std::max<uint64_t>(bytes, 1);
    m_expected[key].push_back(std::make_pair(id, bytes));
    m_pending[key] += bytes;
    Push(key);
  }

  void Advance(double until) {
    EventId stop;
    if (until < 1e299) stop = Simulator::Schedule(Seconds(std::max(0.0, until - Now())), &StopNow);
    Simulator::Run();
    Simulator::Cancel(stop);
  }

 private:
  void Connect(Pair key) {
    uint16_t port = 10000 + key.first;
    Ptr<Socket> listener = Socket::CreateSocket(m_hosts.Get(key.second), TcpSocketFactory::GetTypeId());
    listener->Bind(InetSocketAddress(Ipv4Address::GetAny(), port));
    listener->Listen();
    listener->SetAcceptCallback(MakeNullCallback<bool, Ptr<Socket>, const Address&>(),
                                MakeBoundCallback(&Transport::Accepted, this, key.first, key.second));
    Ptr<Socket> sender = Socket::CreateSocket(m_hosts.Get(key.first), TcpSocketFactory::GetTypeId());
    sender->Bind();
    sender->Connect(InetSocketAddress(m_addresses[key.second], port));
    sender->SetSendCallback(MakeBoundCallback(&Transport::CanSend, this, key.first, key.second));
    m_senders[key] = sender;
    m_listeners.push_back(listener);
  }

  static void Accepted(Transport* self, uint32_t src, uint32_t dst, Ptr<Socket> socket, const Address&) {
    self->m_receivers.push_back(socket);
    socket->SetRecvCallback(MakeBoundCallback(&Transport::Received, self, src, dst));
  }

  static void Received(Transport* self, uint32_t src, uint32_t dst, Ptr<Socket> socket) {
    auto& expected = self->m_expected[Pair(src, dst)];
    Ptr<Packet> packet;
    while ((packet = socket->Recv())) {
      uint64_t bytes = packet->GetSize();
      while (bytes > 0 && !expected.empty()) {
        uint64_t take = std::min<uint64_t>(bytes, expected.front().second);
        expected.front().second -= take;
        bytes -= take;
        if (expected.front().second == 0) {
          self->done_ids.push_back(expected.front().first);
          self->done_times.push_back(Simulator::Now().GetSeconds());
          expected.pop_front();
          Simulator::Stop();
        }
      }
    }
  }

  static void CanSend(Transport* self, uint32_t src, uint32_t dst, Ptr<Socket>, uint32_t) {
    self->Push(Pair(src, dst));
  }

  void Push(Pair key) {
    Ptr<Socket> socket = m_senders[key];
    uint64_t& pending = m_pending[key];
    while (pending > 0) {
      uint32_t room = socket->GetTxAvailable();
      if (room == 0) break;
      uint32_t chunk = (uint32_t) std::min<uint64_t>(pending, std::min<uint32_t>(room, 65536));
      int sent = socket->Send(Create<Packet>(chunk));
      if (sent <= 0) break;
      pending -= sent;
    }
  }

  NodeContainer m_hosts, m_switch;
  std::vector<Ipv4Address> m_addresses;
  std::map<Pair, Ptr<Socket>> m_senders;
  std::vector<Ptr<Socket>> m_listeners, m_receivers;
  std::map<Pair, uint64_t> m_pending;
  std::map<Pair, std::deque<std::pair<int64_t, uint64_t>>> m_expected;
};
}  // namespace dlcsniff_ns3
"""
_loaded: dict = {}


def load():
    """ns-3 and the compiled transport (once per process; a forked child inherits them)."""
    if "gbl" not in _loaded:
        try:
            from ns import ns
        except ImportError as exc:
            raise ReplayError(f"ns-3's Python bindings are missing (`make setup` installs PyPI's ns3): {exc}") from None
        ns.cppyy.cppdef(TRANSPORT)
        _loaded["gbl"] = ns.cppyy.gbl
    return _loaded["gbl"]


class _Ns3Network:
    def __init__(self, transport) -> None:
        self._transport = transport
        self._seen = 0

    def now(self) -> float:
        return float(self._transport.Now())

    def start(self, message: int, src: int, dst: int, size_bytes: float) -> None:
        self._transport.Start(int(message), int(src), int(dst), int(size_bytes))

    def advance(self, until_s: float) -> list[tuple[int, float]]:
        transport = self._transport
        if len(transport.done_ids) == self._seen:
            transport.Advance(min(until_s, UNTIL_END))
        done = [(int(transport.done_ids[i]), float(transport.done_times[i]))
                for i in range(self._seen, len(transport.done_ids))]
        self._seen = len(transport.done_ids)
        return done


def run(links: Links, replay: Callable[[_Ns3Network], object]):
    gbl = load()
    up, down = ([float(min(rate, host)) for rate, host in zip(rates, links.host_bit_s)]
                for rates in (links.up_bit_s, links.down_bit_s))
    vector = gbl.std.vector["double"]
    transport = gbl.dlcsniff_ns3.Transport(vector(up), vector(down), float(links.latency_s), QUEUE_S)
    transport.Advance(0.0)              # the nodes' initialisation events, before any socket is used
    try:
        return replay(_Ns3Network(transport))
    finally:
        gbl.ns3.Simulator.Destroy()
