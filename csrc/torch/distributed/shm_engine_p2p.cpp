// ShmEngine's point to point: send, recv and recv from any source (so
// dist.send / recv / isend / irecv / batch_isend_irecv and the object helpers
// built on them) over the cpu_shm channels of core/executors/cpu_shm/shm_p2p.h.
#include <ATen/core/ivalue.h>

#include "../dtypes.h"  // dtype_str
#include "shm_engine.h"

namespace fastpar {
namespace distributed {

namespace {

// An operation that may still be moving when it is returned (a send larger
// than the channel's ring, a receive whose message has not come): wait()
// drives the engine until it is done, as gloo's send/recv works do.
class P2PWork : public c10d::Work {
 public:
  P2PWork(c10d::OpType type, std::shared_ptr<cpu_shm::ShmP2P> engine, std::shared_ptr<cpu_shm::P2POp> op,
          std::vector<at::Tensor> tensors, const char* name)
      : Work(-1, type), engine_(std::move(engine)), op_(std::move(op)), tensors_(std::move(tensors)), name_(name) {}

  bool isCompleted() override {
    if (!op_->done.load(std::memory_order_acquire)) engine_->poke();
    return op_->done.load(std::memory_order_acquire);
  }
  bool isSuccess() const override { return op_->done.load(std::memory_order_acquire) && op_->error.empty(); }
  bool wait(std::chrono::milliseconds timeout) override {
    bool finished = false;
    run_transport([&] { finished = engine_->wait(op_, timeout); });
    if (!finished)
      C10_THROW_ERROR(DistBackendError, std::string("fastpar.") + name_ + ": wait() timed out after " +
                                            std::to_string(timeout.count()) + " ms (" + op_->what + ", tag " +
                                            std::to_string(op_->tag) + ", " + std::to_string(op_->moved) + " of " +
                                            std::to_string(op_->bytes) + " bytes moved)");
    return true;
  }
  // The sender of a receive (dist.recv(src=None) returns it). One host: local
  // rank == group rank.
  int sourceRank() const override { return op_->source; }
  std::vector<at::Tensor> result() override { return tensors_; }

 private:
  std::shared_ptr<cpu_shm::ShmP2P> engine_;
  std::shared_ptr<cpu_shm::P2POp> op_;
  std::vector<at::Tensor> tensors_;  // keeps the memory the engine reads / writes alive
  const char* name_;
};

std::string describe(const at::Tensor& t) {
  std::string s = dtype_str(t.scalar_type());
  if (s.rfind("torch.", 0) == 0) s = s.substr(6);
  return s + " x " + std::to_string(t.numel());
}

int64_t nbytes(const at::Tensor& t) { return t.numel() * int64_t(t.element_size()); }

}  // namespace

Work ShmEngine::send(at::Tensor& t, int peer, int tag) {
  std::shared_ptr<cpu_shm::P2POp> op;
  run_transport([&] { op = p2p_->send(t.data_ptr(), nbytes(t), peer, tag, describe(t), timeout_); });
  return c10::make_intrusive<P2PWork>(c10d::OpType::SEND, p2p_, std::move(op), std::vector<at::Tensor>{t}, "send");
}

// `peer` -1: from any rank.
Work ShmEngine::recv(at::Tensor& t, int peer, int tag) {
  std::shared_ptr<cpu_shm::P2POp> op;
  run_transport([&] { op = p2p_->recv(t.data_ptr(), nbytes(t), peer, tag, describe(t), timeout_); });
  return c10::make_intrusive<P2PWork>(peer < 0 ? c10d::OpType::RECVANYSOURCE : c10d::OpType::RECV, p2p_,
                                      std::move(op), std::vector<at::Tensor>{t}, "recv");
}

}  // namespace distributed
}  // namespace fastpar
