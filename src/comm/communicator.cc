// Shared parts of the communicator interface: names, stats and scalar helpers.
#include "comm/communicator.h"

namespace gale {

const char* comm_op_name(CommOp op) {
  switch (op) {
    case CommOp::kAllReduce: return "all_reduce";
    case CommOp::kReduceScatter: return "reduce_scatter";
    case CommOp::kAllGather: return "all_gather";
    case CommOp::kBroadcast: return "broadcast";
    case CommOp::kSend: return "send";
    case CommOp::kRecv: return "recv";
    case CommOp::kAllToAll: return "all_to_all";
    case CommOp::kBarrier: return "barrier";
    case CommOp::kCount: break;
  }
  return "?";
}

int64_t CommStats::total_bytes() const {
  int64_t t = 0;
  for (int64_t b : bytes) t += b;
  return t;
}

int64_t CommStats::total_calls() const {
  int64_t t = 0;
  for (int64_t c : calls) t += c;
  return t;
}

void Communicator::trace_issue(CommOp op, int64_t bytes) {
  trace_instant(TraceCategory::kComm, comm_op_name(op), {{"bytes", bytes}, {"group_size", size()}}, "group", name());
}

void Communicator::trace_wait_event(CommOp op, int64_t bytes, double seconds) {
  trace_complete_ending_now(TraceCategory::kComm, std::string(comm_op_name(op)) + " wait", seconds,
                            {{"bytes", bytes}, {"group_size", size()}}, "group", name());
}

double Communicator::all_reduce_scalar(double value, ReduceOp op) {
  double v = value;
  all_reduce(&v, 1, DType::kF64, op);
  return v;
}

int64_t Communicator::all_reduce_scalar(int64_t value, ReduceOp op) {
  int64_t v = value;
  all_reduce(&v, 1, DType::kI64, op);
  return v;
}

}  // namespace gale
