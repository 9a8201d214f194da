// Runs a fuzz target's LLVMFuzzerTestOneInput over its seeds and the files
// (or every file of directories) given as arguments: the regression inputs
// in builds without libFuzzer. `--write_seeds DIR` writes the seeds as files
// instead (the fuzz build's starting corpus). Exit status 0 when every
// input ran (a finding aborts).
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
// Defined by each target: valid inputs to start from.
std::vector<std::string> KvmemFuzzSeeds();

int main(int argc, char** argv) {
  const std::vector<std::string> seeds = KvmemFuzzSeeds();
  if (argc == 3 && std::string(argv[1]) == "--write_seeds") {
    std::filesystem::create_directories(argv[2]);
    for (size_t i = 0; i < seeds.size(); ++i) {
      std::ofstream out(
          std::filesystem::path(argv[2]) / ("seed-" + std::to_string(i)),
          std::ios::binary);
      out << seeds[i];
    }
    std::printf("%zu seeds written to %s\n", seeds.size(), argv[2]);
    return 0;
  }
  for (const std::string& s : seeds) {
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(s.data()),
                           s.size());
  }
  std::vector<std::filesystem::path> files;
  for (int i = 1; i < argc; ++i) {
    const std::filesystem::path p(argv[i]);
    if (std::filesystem::is_directory(p)) {
      for (const auto& e : std::filesystem::directory_iterator(p)) {
        if (e.is_regular_file()) files.push_back(e.path());
      }
    } else {
      files.push_back(p);
    }
  }
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)),
                            std::istreambuf_iterator<char>());
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()),
                           bytes.size());
  }
  std::printf("%zu seeds and %zu inputs ran\n", seeds.size(), files.size());
  return 0;
}
