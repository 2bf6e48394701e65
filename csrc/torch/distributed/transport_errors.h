// How transport failures reach torch.distributed users. The transports are
// torch-free and throw std exceptions: std::invalid_argument for a bad call
// (raised before any rank waits) and std::runtime_error for a failed
// collective (timeout, dead, aborted or mismatched peer). Here they become
// ValueError and torch.distributed.DistBackendError, as other backends' are.
#pragma once

#include <c10/util/Exception.h>

#include <stdexcept>

namespace fastpar {
namespace distributed {

template <class F>
void run_transport(F&& f) {
  try {
    f();
  } catch (const c10::Error&) {
    throw;
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK_VALUE(false, e.what());
  } catch (const std::exception& e) {
    C10_THROW_ERROR(DistBackendError, e.what());
  }
}

}  // namespace distributed
}  // namespace fastpar
