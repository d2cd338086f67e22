#include "core/buffer_budget.hpp"

namespace weir::core {

constinit BufferBudget process_buffers;

}  // namespace weir::core
