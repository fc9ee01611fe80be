// Prints the byte layout of bytedance/ps-lite's RawMeta and RawNode (src/meta.h of the tree it is compiled
// against) as one JSON object: what the compiler lays out is what goes on the wire (Van::PackMeta memcpy's
// these structs into the meta frame).
#include <cstddef>
#include <cstdio>

#include "meta.h"

#define FIELD(type, name) std::printf("\"%s\": [%zu, %zu], ", #name, offsetof(type, name), sizeof(type::name))

int main() {
  std::printf("{\"RawMeta\": {\"sizeof\": %zu, ", sizeof(ps::RawMeta));
  FIELD(ps::RawMeta, head);
  FIELD(ps::RawMeta, body_size);
  std::printf("\"control.cmd\": [%zu, 4], ", offsetof(ps::RawMeta, control) + offsetof(ps::RawControl, cmd));
  std::printf("\"control.node_size\": [%zu, 4], ",
              offsetof(ps::RawMeta, control) + offsetof(ps::RawControl, node_size));
  std::printf("\"control.barrier_group\": [%zu, 4], ",
              offsetof(ps::RawMeta, control) + offsetof(ps::RawControl, barrier_group));
  std::printf("\"control.msg_sig\": [%zu, 8], ", offsetof(ps::RawMeta, control) + offsetof(ps::RawControl, msg_sig));
  FIELD(ps::RawMeta, request);
  FIELD(ps::RawMeta, app_id);
  FIELD(ps::RawMeta, timestamp);
  FIELD(ps::RawMeta, data_type_size);
  FIELD(ps::RawMeta, customer_id);
  FIELD(ps::RawMeta, push);
  FIELD(ps::RawMeta, simple_app);
  FIELD(ps::RawMeta, data_size);
  FIELD(ps::RawMeta, key);
  FIELD(ps::RawMeta, addr);
  FIELD(ps::RawMeta, val_len);
  std::printf("\"option\": [%zu, %zu]}, ", offsetof(ps::RawMeta, option), sizeof(ps::RawMeta::option));
  std::printf("\"RawNode\": {\"sizeof\": %zu, ", sizeof(ps::RawNode));
  FIELD(ps::RawNode, role);
  FIELD(ps::RawNode, id);
  FIELD(ps::RawNode, hostname);
  FIELD(ps::RawNode, port);
  FIELD(ps::RawNode, is_recovery);
  FIELD(ps::RawNode, customer_id);
  FIELD(ps::RawNode, endpoint_name);
  FIELD(ps::RawNode, endpoint_name_len);
  std::printf("\"aux_id\": [%zu, %zu]}}\n", offsetof(ps::RawNode, aux_id), sizeof(ps::RawNode::aux_id));
  return 0;
}
