// A small bytedance/ps-lite job (the ps-lite BytePS 0.2.5.post15 ships): scheduler, server or worker by
// DMLC_ROLE, with ps-lite's usual DMLC_* environment.
//
//   kv_app --record PATH [--rounds N] [--protocol kv|byteps] [--max-bytes N]
//
// --protocol kv (default), against kv_app's own servers: workers push and pull BytePS-shaped keys (partition
// key (tensor << 16) + part, placed on a server by djb2 of its decimal string, as ps key = that server's
// range begin + key) with KVWorker<char> (app 0, as BytePS) and KVWorker<float> (app 1, customer 1), values
// of 4 B to 3 MB (or --max-bytes), one or several keys per request, keys on one or several servers, with
// and without lens; push-then-pull without waiting in between, for several sizes (this ps-lite has no
// ZPushPull); several requests in flight; a SimpleApp request with a body. Each worker has keys of its own and checks every
// pulled value against what it pushed. The server stores what is pushed and answers pulls from the store.
// --protocol byteps, against BytePS's own server (bin/byteps_server): see RunBytepsWorker.
// Scheduler: ps-lite only.
//
// Each node writes JSON lines to PATH, the ground truth beside ps-lite's own PS_VERBOSE=2 log:
//   worker: {"event": "request", "op", "app", "customer", "ts" (what ZPush/ZPull returned), "cmd" (head),
//            "keys", "parts" ([tensor, part] per key), "lens" (bytes per key), "dtype" (byteps only),
//            "with_lens", "answer" (data frames the answer carries), "val_type_bytes",
//            "messages": [{"server" (rank), "keys", "vals_bytes"}] (one ps-lite message per server touched),
//            "issue_ns", "done_ns", "verified" (a pull brought back the expected values)}
//           {"event": "request", "op": "simple", "app", "customer", "ts", "cmd", "body", "recvers", ...}
//   server: {"event": "handled", "app", "sender", "customer", "ts", "cmd", "push", "keys", "lens",
//            "vals_bytes", "ns"}, {"event": "simple", "sender", "ts", "head", "body"}
//   all:    {"event": "started"|"finished", "role", "ns"[, "rank", "id", "num_servers", "num_workers"]}
#include <ps/ps.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

using ps::Key;

constexpr int kCharApp = 0;         // BytePS's KVServer<char>(0) / KVWorker<char>(0, 0)
constexpr int kFloatApp = 1;
constexpr int kFloatCustomer = 1;
constexpr int kSimpleHead = 7;
// Request heads (KVMeta::cmd): what the server puts in its answer.
constexpr int kCmdPlain = 0;        // push answered with no data, pull with keys + vals
constexpr int kCmdAckKeys = 1;      // push answered with the keys and an empty vals frame
constexpr int kCmdPullLens = 2;     // pull answered with keys + vals + lens
constexpr uint64_t kPartitionBytes = 1 << 20;
constexpr int kPartBits = 16;

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch()).count();
}

class JsonLines {
 public:
  explicit JsonLines(const std::string& path) : file_(std::fopen(path.c_str(), "w")) {
    if (file_ == nullptr) {
      std::perror(path.c_str());
      std::exit(2);
    }
  }
  ~JsonLines() { std::fclose(file_); }
  void Write(const std::string& line) {
    std::lock_guard<std::mutex> lock(mu_);
    std::fputs(line.c_str(), file_);
    std::fputc('\n', file_);
    std::fflush(file_);
  }

 private:
  std::FILE* file_;
  std::mutex mu_;
};

template <typename C>
std::string JsonArray(const C& items) {
  std::ostringstream out;
  out << "[";
  bool first = true;
  for (const auto& item : items) {
    out << (first ? "" : ", ") << item;
    first = false;
  }
  out << "]";
  return out.str();
}

std::string JsonString(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

std::string NodeLine(const char* event) {
  auto* po = ps::Postoffice::Get();
  const char* role = po->is_worker() ? "worker" : po->is_server() ? "server" : "scheduler";
  std::ostringstream out;
  out << "{\"event\": \"" << event << "\", \"role\": \"" << role << "\", \"ns\": " << NowNs();
  if (std::strcmp(event, "started") == 0) {
    out << ", \"rank\": " << (po->is_scheduler() ? 0 : po->my_rank()) << ", \"id\": " << po->van()->my_node().id
        << ", \"num_servers\": " << po->num_servers() << ", \"num_workers\": " << po->num_workers();
  }
  return out.str() + "}";
}

// Value bytes of a key at a version: periodic (period 256) so that captures compress.
uint8_t PatternByte(Key key, int version, size_t i) {
  return static_cast<uint8_t>(key * 31 + static_cast<uint64_t>(version) * 17 + i);
}

// ---------------------------------------------------------------------------------------------- server

template <typename Val>
class Store {
 public:
  Store(int app_id, JsonLines* record) : app_id_(app_id), record_(record) {}

  void operator()(const ps::KVMeta& req, const ps::KVPairs<Val>& data, ps::KVServer<Val>* server) {
    const size_t n = data.keys.size();
    std::vector<size_t> lens(n);   // in Val elements
    if (data.lens.size()) {
      for (size_t i = 0; i < n; ++i) lens[i] = data.lens[i];
    } else if (n) {
      std::fill(lens.begin(), lens.end(), data.vals.size() / n);
    }
    Log(req, data);
    ps::KVPairs<Val> res;
    if (req.push) {
      std::lock_guard<std::mutex> lock(mu_);
      size_t offset = 0;
      for (size_t i = 0; i < n; ++i) {
        values_[data.keys[i]].assign(data.vals.data() + offset, data.vals.data() + offset + lens[i]);
        offset += lens[i];
      }
      if (req.cmd & kCmdAckKeys) res.keys = data.keys;   // vals stay empty: a 0-byte frame
    } else {
      std::lock_guard<std::mutex> lock(mu_);
      res.keys = data.keys;
      std::vector<Val> vals;
      std::vector<int> out_lens;
      for (size_t i = 0; i < n; ++i) {
        const auto& stored = values_[data.keys[i]];
        vals.insert(vals.end(), stored.begin(), stored.end());
        out_lens.push_back(static_cast<int>(stored.size()));
      }
      res.vals = ps::SArray<Val>(vals);
      if (req.cmd & kCmdPullLens) res.lens = ps::SArray<int>(out_lens);
    }
    server->Response(req, res);
  }

 private:
  void Log(const ps::KVMeta& req, const ps::KVPairs<Val>& data) {
    std::vector<Key> keys(data.keys.begin(), data.keys.end());
    std::ostringstream out;
    out << "{\"event\": \"handled\", \"app\": " << app_id_ << ", \"sender\": " << req.sender
        << ", \"customer\": " << req.customer_id << ", \"ts\": " << req.timestamp << ", \"cmd\": " << req.cmd
        << ", \"push\": " << (req.push ? "true" : "false") << ", \"keys\": " << JsonArray(keys)
        << ", \"lens\": " << (data.lens.size() ? JsonArray(std::vector<int>(data.lens.begin(), data.lens.end()))
                                               : "null")
        << ", \"vals_bytes\": " << data.vals.size() * sizeof(Val) << ", \"ns\": " << NowNs() << "}";
    record_->Write(out.str());
  }

  int app_id_;
  JsonLines* record_;
  std::mutex mu_;
  std::unordered_map<Key, std::vector<Val>> values_;
};

void RunServer(JsonLines* record) {
  ps::KVServer<char> char_server(kCharApp);
  Store<char> char_store(kCharApp, record);
  char_server.set_request_handle(std::ref(char_store));
  // KVServer::set_request_handle hides SimpleApp's: a SimpleApp request (head, body) is answered with a body.
  char_server.SimpleApp::set_request_handle([record](const ps::SimpleData& req, ps::SimpleApp* app) {
    record->Write("{\"event\": \"simple\", \"sender\": " + std::to_string(req.sender) + ", \"ts\": " +
                  std::to_string(req.timestamp) + ", \"head\": " + std::to_string(req.head) + ", \"body\": " +
                  JsonString(req.body) + "}");
    app->Response(req, "ack " + req.body);
  });
  ps::KVServer<float> float_server(kFloatApp);
  Store<float> float_store(kFloatApp, record);
  float_server.set_request_handle(std::ref(float_store));
  // As BytePS's server: the KVServers exist before ps-lite starts, then the start barrier.
  ps::StartAsync(0, "kv_app");
  ps::Postoffice::Get()->Barrier(0, ps::kWorkerGroup + ps::kServerGroup + ps::kScheduler);
  record->Write(NodeLine("started"));
  ps::Finalize(0, true);
}

// ---------------------------------------------------------------------------------------------- worker

uint64_t Djb2(uint64_t key) {
  uint64_t hash = 5381;
  for (char c : std::to_string(key)) hash = hash * 33 + static_cast<unsigned char>(c);
  return hash;
}

struct Part {
  Key ps_key;
  int server;
  size_t bytes;
  uint64_t tensor;                   // BytePS: declared tensor index
  uint64_t part;                     // partition index within the tensor
};

// BytePS's partition keys of a tensor of `bytes` bytes: parts of at most kPartitionBytes.
std::vector<Part> Partition(uint64_t tensor, size_t bytes) {
  const auto& ranges = ps::Postoffice::Get()->GetServerKeyRanges();
  std::vector<Part> parts;
  size_t offset = 0;
  for (uint64_t part = 0; offset < bytes || part == 0; ++part) {
    size_t size = std::min<size_t>(kPartitionBytes, bytes - offset);
    uint64_t key = (tensor << kPartBits) + part;
    int server = static_cast<int>(Djb2(key) % ranges.size());
    parts.push_back({ranges[server].begin() + key, server, size, tensor, part});
    offset += size;
  }
  return parts;
}

using Bytes = std::string;
// The bytes of one part's value: what a push sends, or what a pull should bring back.
using ValueOf = std::function<Bytes(const Part&)>;

Bytes Pattern(const Part& part, int version) {
  Bytes out(part.bytes, '\0');
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<char>(PatternByte(part.ps_key, version, i));
  return out;
}

// What the server's answer to a request carries (data frames): the checker's expectation.
enum Answer { kAnswerNothing, kAnswerKeys, kAnswerKeysVals, kAnswerKeysValsLens };
const char* kAnswerNames[] = {"[]", "[\"keys\", \"vals\"]", "[\"keys\", \"vals\"]", "[\"keys\", \"vals\", \"lens\"]"};

template <typename Val>
class Client {
 public:
  Client(int app_id, int customer_id, JsonLines* record)
      : kv_(app_id, customer_id), app_id_(app_id), customer_id_(customer_id), record_(record) {}

  struct Request {
    std::string op;
    int ts = -1;
    int cmd = 0;
    bool with_lens = false;
    Answer answer = kAnswerNothing;
    std::vector<Key> keys;
    std::vector<std::string> parts;      // per key: "[tensor, part]"
    std::vector<size_t> bytes;           // per key
    std::string dtype;                   // BytePS: the values' dtype (in the head), else empty
    std::vector<Bytes> expected;         // a pull's values, per key
    ps::SArray<Key> sa_keys;             // alive until done (zero-copy ZPush / ZPull)
    ps::SArray<Val> sa_vals;
    ps::SArray<int> sa_lens;
    int64_t issue_ns = 0;
  };
  using RequestPtr = std::shared_ptr<Request>;

  // Push these parts (sorted here by ps key, as KVWorker requires) with the values `value` gives.
  RequestPtr Push(std::vector<Part> parts, const ValueOf& value, bool with_lens, int cmd, Answer answer) {
    auto req = Prepare("push", &parts, cmd, with_lens, answer);
    Bytes vals;
    std::vector<int> lens;
    for (const auto& part : parts) {
      Bytes bytes = value(part);
      vals += bytes.substr(0, bytes.size() / sizeof(Val) * sizeof(Val));
      lens.push_back(static_cast<int>(bytes.size() / sizeof(Val)));
    }
    const Val* typed = reinterpret_cast<const Val*>(vals.data());
    req->sa_vals = ps::SArray<Val>(std::vector<Val>(typed, typed + vals.size() / sizeof(Val)));
    if (with_lens) req->sa_lens = ps::SArray<int>(lens);
    req->issue_ns = NowNs();
    req->ts = kv_.ZPush(req->sa_keys, req->sa_vals, req->sa_lens, cmd);
    return req;
  }

  // Pull these parts, expecting the values `expected` gives; with_lens: ask for (and check) lens too.
  RequestPtr Pull(std::vector<Part> parts, const ValueOf& expected, bool with_lens, int cmd, Answer answer) {
    auto req = Prepare("pull", &parts, cmd, with_lens, answer);
    for (const auto& part : parts) req->expected.push_back(expected(part));
    req->issue_ns = NowNs();
    req->ts = kv_.ZPull(req->sa_keys, &req->sa_vals, with_lens ? &req->sa_lens : nullptr, cmd);
    return req;
  }

  // Wait, check a pull's values, and record the request.
  void Finish(const RequestPtr& req, const std::string& op_name = "") {
    kv_.Wait(req->ts);
    int64_t done_ns = NowNs();
    bool verified = true;
    if (req->op == "pull") {
      Bytes got(reinterpret_cast<const char*>(req->sa_vals.data()), req->sa_vals.size() * sizeof(Val));
      Bytes want;
      for (size_t k = 0; k < req->keys.size(); ++k) {
        want += req->expected[k];
        if (req->with_lens && static_cast<size_t>(req->sa_lens[k]) * sizeof(Val) != req->expected[k].size()) {
          verified = false;
        }
      }
      verified = verified && got == want;
      if (!verified) LOG(ERROR) << "pull ts=" << req->ts << " returned other values than expected";
    }
    Record(*req, op_name.empty() ? req->op : op_name, done_ns, verified);
  }

  int SimpleRequest(const std::string& body) {
    int64_t issue_ns = NowNs();
    int ts = kv_.Request(kSimpleHead, body, ps::kServerGroup);
    kv_.SimpleApp::Wait(ts);
    std::ostringstream out;
    out << "{\"event\": \"request\", \"op\": \"simple\", \"app\": " << app_id_ << ", \"customer\": " << customer_id_
        << ", \"ts\": " << ts << ", \"cmd\": " << kSimpleHead << ", \"body\": " << JsonString(body)
        << ", \"recvers\": " << JsonArray(ps::Postoffice::Get()->GetNodeIDs(ps::kServerGroup))
        << ", \"issue_ns\": " << issue_ns << ", \"done_ns\": " << NowNs() << "}";
    record_->Write(out.str());
    return ts;
  }

 private:
  RequestPtr Prepare(const char* op, std::vector<Part>* parts, int cmd, bool with_lens, Answer answer) {
    std::sort(parts->begin(), parts->end(), [](const Part& a, const Part& b) { return a.ps_key < b.ps_key; });
    auto req = std::make_shared<Request>();
    req->op = op;
    req->cmd = cmd;
    req->with_lens = with_lens;
    req->answer = answer;
    for (const auto& part : *parts) {
      req->keys.push_back(part.ps_key);
      req->parts.push_back("[" + std::to_string(part.tensor) + ", " + std::to_string(part.part) + "]");
      req->bytes.push_back(part.bytes / sizeof(Val) * sizeof(Val));
    }
    req->sa_keys = ps::SArray<Key>(req->keys);
    return req;
  }

  // One line per request, with the ps-lite messages it becomes: one per server touched (KVWorker's slicer).
  void Record(const Request& req, const std::string& op, int64_t done_ns, bool verified) {
    const auto& ranges = ps::Postoffice::Get()->GetServerKeyRanges();
    std::map<int, std::vector<size_t>> by_server;
    for (size_t k = 0; k < req.keys.size(); ++k) {
      for (size_t s = 0; s < ranges.size(); ++s) {
        if (ranges[s].begin() <= req.keys[k] && req.keys[k] < ranges[s].end()) by_server[s].push_back(k);
      }
    }
    std::ostringstream messages;
    messages << "[";
    bool first = true;
    for (const auto& entry : by_server) {
      std::vector<Key> keys;
      size_t vals_bytes = 0;
      for (size_t k : entry.second) {
        keys.push_back(req.keys[k]);
        vals_bytes += req.bytes[k];
      }
      messages << (first ? "" : ", ") << "{\"server\": " << entry.first << ", \"keys\": " << JsonArray(keys)
               << ", \"vals_bytes\": " << vals_bytes << "}";
      first = false;
    }
    messages << "]";
    std::ostringstream out;
    out << "{\"event\": \"request\", \"op\": \"" << op << "\", \"app\": " << app_id_ << ", \"customer\": "
        << customer_id_ << ", \"ts\": " << req.ts << ", \"cmd\": " << req.cmd << ", \"keys\": " << JsonArray(req.keys)
        << ", \"parts\": " << JsonArray(req.parts) << ", \"lens\": " << JsonArray(req.bytes)
        << (req.dtype.empty() ? "" : ", \"dtype\": " + JsonString(req.dtype))
        << ", \"with_lens\": " << (req.with_lens ? "true" : "false")
        << ", \"answer\": " << kAnswerNames[req.answer] << ", \"val_type_bytes\": " << sizeof(Val)
        << ", \"messages\": " << messages.str() << ", \"issue_ns\": " << req.issue_ns << ", \"done_ns\": " << done_ns
        << ", \"verified\": " << (verified ? "true" : "false") << "}";
    record_->Write(out.str());
  }

  ps::KVWorker<Val> kv_;
  int app_id_;
  int customer_id_;
  JsonLines* record_;
};

// Against kv_app's own servers: every kind of request, each worker on keys of its own.
void RunKvWorker(JsonLines* record, int rounds, size_t max_bytes) {
  const int rank = ps::MyRank();
  Client<char> bytes(kCharApp, 0, record);
  Client<float> floats(kFloatApp, kFloatCustomer, record);
  // Tensor ids of this worker: rank * 1000 + n, so that each worker pulls back what it pushed itself.
  uint64_t next_tensor = static_cast<uint64_t>(rank) * 1000;
  auto tensor = [&next_tensor](size_t bytes_) { return Partition(next_tensor++, bytes_); };
  // --max-bytes: tensors larger than this are left out (smaller captures)
  auto fits = [max_bytes](const std::vector<Part>& parts) {
    size_t total = 0;
    for (const auto& part : parts) total += part.bytes;
    return total <= max_bytes;
  };

  const std::vector<size_t> sizes = {4, 8, 12, 100, 1000, 1448, 4096, 65535, 65536, 100000, 1 << 20};
  std::vector<std::vector<Part>> singles;
  for (size_t size : sizes) {
    if (size <= max_bytes) singles.push_back(tensor(size));
  }
  std::vector<Part> mixed;                       // one request, keys of several sizes, over the servers
  for (size_t size : {4, 1000, 70000, 8, 300000, 12}) mixed.push_back(tensor(size)[0]);
  std::vector<Part> uniform;                     // one request, 8 keys of 256 B, no lens
  for (int i = 0; i < 8; ++i) uniform.push_back(tensor(256)[0]);
  std::vector<Part> large = tensor((3 << 20) + 4);   // 4 parts, one request
  std::vector<std::vector<Part>> pushpulls;          // the last one in 2 parts
  for (size_t size : {8, 1448, 65536, 3 << 19}) {
    if (size <= max_bytes) pushpulls.push_back(tensor(size));
  }
  std::vector<std::vector<Part>> burst;
  for (int i = 0; i < 16; ++i) burst.push_back(tensor(4096));
  std::vector<Part> float_keys;
  for (int i = 0; i < 3; ++i) float_keys.push_back(tensor(40)[0]);

  for (int round = 0; round < rounds; ++round) {
    ValueOf value = [round](const Part& part) { return Pattern(part, round); };
    const Answer pull_lens = kAnswerKeysValsLens, pull_plain = kAnswerKeysVals;
    for (size_t i = 0; i < singles.size(); ++i) {
      // every other size with lens, as BytePS always sends them
      bool with_lens = i % 2 == 0;
      bytes.Finish(bytes.Push(singles[i], value, with_lens, kCmdPlain, kAnswerNothing));
      bytes.Finish(bytes.Pull(singles[i], value, with_lens, with_lens ? kCmdPullLens : kCmdPlain,
                              with_lens ? pull_lens : pull_plain));
    }
    bytes.Finish(bytes.Push(mixed, value, true, kCmdAckKeys, kAnswerKeys));
    bytes.Finish(bytes.Pull(mixed, value, true, kCmdPullLens, pull_lens));
    bytes.Finish(bytes.Push(uniform, value, false, kCmdAckKeys, kAnswerKeys));
    bytes.Finish(bytes.Pull(uniform, value, false, kCmdPlain, pull_plain));
    if (round == 0 && fits(large)) {
      bytes.Finish(bytes.Push(large, value, true, kCmdPlain, kAnswerNothing));
      bytes.Finish(bytes.Pull(large, value, true, kCmdPullLens, pull_lens));
    }
    for (const auto& parts : pushpulls) {   // push then pull with no wait in between: both in flight at once
      auto push = bytes.Push(parts, value, true, kCmdPlain, kAnswerNothing);
      auto pull = bytes.Pull(parts, value, true, kCmdPullLens, pull_lens);
      bytes.Finish(push, "pushpull.push");
      bytes.Finish(pull, "pushpull.pull");
    }
    // 16 pushes in flight, then 16 pulls in flight
    std::vector<Client<char>::RequestPtr> inflight;
    for (const auto& parts : burst) inflight.push_back(bytes.Push(parts, value, true, kCmdPlain, kAnswerNothing));
    for (const auto& req : inflight) bytes.Finish(req, "burst.push");
    inflight.clear();
    for (const auto& parts : burst) inflight.push_back(bytes.Pull(parts, value, true, kCmdPullLens, pull_lens));
    for (const auto& req : inflight) bytes.Finish(req, "burst.pull");
    floats.Finish(floats.Push(float_keys, value, false, kCmdPlain, kAnswerNothing));
    floats.Finish(floats.Pull(float_keys, value, false, kCmdPlain, pull_plain));
    bytes.SimpleRequest("hello from worker " + std::to_string(rank) + " round " + std::to_string(round));
  }
}

// Against BytePS's own server (byteps/server/server.cc), speaking its protocol: KVWorker<char>, one key per
// request with lens, head = Cantor pairing of (request type, dtype) (common.cc GetCommandType), the same
// tensors on every worker; a first "init" push of every key (answered once every worker sent it), then per
// round a push of every key and a pull of every key, which the server answers with the sum over the workers
// once all of them pushed (sync mode). Values: element i of worker r = (r + 1) * ((key + round + i) % 97),
// so the sum is exact in every dtype.
enum BytepsDtype { kBpsFloat32 = 0, kBpsFloat64 = 1, kBpsInt32 = 4 };

int BytepsHead(int request_type, int dtype) {
  return (request_type + dtype) * (request_type + dtype + 1) / 2 + dtype;
}

template <typename T>
Bytes BytepsValue(const Part& part, int round, int64_t factor) {
  std::vector<T> out(part.bytes / sizeof(T));
  const uint64_t key = part.ps_key - ps::Postoffice::Get()->GetServerKeyRanges()[part.server].begin();
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = static_cast<T>(factor * static_cast<int64_t>((key + round + i) % 97));
  }
  return Bytes(reinterpret_cast<const char*>(out.data()), out.size() * sizeof(T));
}

void RunBytepsWorker(JsonLines* record, int rounds) {
  const int rank = ps::MyRank();
  const int workers = ps::NumWorkers();
  Client<char> bytes(kCharApp, 0, record);
  struct Tensor {
    std::vector<Part> parts;
    int dtype;
  };
  std::vector<Tensor> tensors;
  uint64_t declared = 0;   // BytePS declares tensors in order: key = (declared << 16) + part
  for (const auto& shape : std::vector<std::pair<size_t, int>>{
           {4, kBpsFloat32}, {4000, kBpsFloat32}, {400000, kBpsFloat32}, {(1 << 20) + 8, kBpsFloat32},
           {1000, kBpsInt32}, {8192, kBpsFloat64}}) {
    tensors.push_back({Partition(declared++, shape.first), shape.second});
  }
  auto dtype_name = [](int dtype) {
    return std::string(dtype == kBpsFloat64 ? "float64" : dtype == kBpsInt32 ? "int32" : "float32");
  };
  auto value_of = [](int dtype, int round, int64_t factor) -> ValueOf {
    return [dtype, round, factor](const Part& part) {
      return dtype == kBpsFloat64 ? BytepsValue<double>(part, round, factor)
             : dtype == kBpsInt32 ? BytepsValue<int32_t>(part, round, factor)
                                  : BytepsValue<float>(part, round, factor);
    };
  };
  std::vector<Client<char>::RequestPtr> inflight;
  for (const auto& t : tensors) {
    for (const auto& part : t.parts) {
      inflight.push_back(bytes.Push({part}, value_of(t.dtype, -1, rank + 1), true, BytepsHead(0, t.dtype),
                                    kAnswerNothing));
      inflight.back()->dtype = dtype_name(t.dtype);
    }
  }
  for (const auto& req : inflight) bytes.Finish(req, "init.push");
  for (int round = 0; round < rounds; ++round) {
    inflight.clear();
    for (const auto& t : tensors) {
      for (const auto& part : t.parts) {
        inflight.push_back(bytes.Push({part}, value_of(t.dtype, round, rank + 1), true, BytepsHead(0, t.dtype),
                                      kAnswerNothing));
        inflight.back()->dtype = dtype_name(t.dtype);
      }
    }
    for (const auto& req : inflight) bytes.Finish(req);
    inflight.clear();
    for (const auto& t : tensors) {
      for (const auto& part : t.parts) {
        inflight.push_back(bytes.Pull({part}, value_of(t.dtype, round, workers * (workers + 1) / 2), true,
                                      BytepsHead(0, t.dtype), kAnswerKeysValsLens));
        inflight.back()->dtype = dtype_name(t.dtype);
      }
    }
    for (const auto& req : inflight) bytes.Finish(req);
    // every worker has its sums before anyone pushes the next round
    ps::Postoffice::Get()->Barrier(0, ps::kWorkerGroup);
  }
}

}  // namespace

int main(int argc, char* argv[]) {
  std::string record_path;
  int rounds = 2;
  std::string protocol = "kv";
  size_t max_bytes = SIZE_MAX;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    if (flag == "--record") {
      record_path = argv[i + 1];
    } else if (flag == "--rounds") {
      rounds = std::atoi(argv[i + 1]);
    } else if (flag == "--protocol") {
      protocol = argv[i + 1];
    } else if (flag == "--max-bytes") {
      max_bytes = std::strtoull(argv[i + 1], nullptr, 10);
    }
  }
  if (record_path.empty() || rounds < 1 || (protocol != "kv" && protocol != "byteps")) {
    std::fprintf(stderr,
                 "usage: %s --record PATH [--rounds N] [--protocol kv|byteps] [--max-bytes N]  (role from DMLC_ROLE)\n",
                 argv[0]);
    return 2;
  }
  JsonLines record(record_path);
  const char* role = std::getenv("DMLC_ROLE");
  if (role != nullptr && std::string(role) == "server") {
    RunServer(&record);
  } else {
    ps::Start(0, "kv_app");
    record.Write(NodeLine("started"));
    if (ps::IsWorker()) {
      if (protocol == "byteps") {
        RunBytepsWorker(&record, rounds);
      } else {
        RunKvWorker(&record, rounds, max_bytes);
      }
    }
    ps::Finalize(0, true);
  }
  record.Write(NodeLine("finished"));
  return 0;
}
