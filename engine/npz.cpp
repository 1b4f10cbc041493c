// TEMPORARY: the .npz reader/writer lands in the next commit (safetensors first, for the
// capture command).
#include "engine/npz.h"

#include "engine/error.h"

namespace kvscope {
NpyHeader parse_npy_header(const uint8_t*, size_t, const std::string& what) {
  throw InputError(what + ": .npz support not implemented yet");
}
std::unique_ptr<TensorArchive> open_npz(std::shared_ptr<const MappedFile> file) {
  throw InputError(file->path() + ": .npz support not implemented yet");
}
std::unique_ptr<TensorFileWriter> create_npz_writer(const std::string& path,
                                                    const std::map<std::string, std::string>&,
                                                    const std::vector<TensorPlan>&) {
  throw InputError(path + ": .npz writing not implemented yet");
}
}  // namespace kvscope
