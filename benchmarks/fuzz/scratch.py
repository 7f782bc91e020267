"""What the fuzzer may change (scratch) and what must survive the run (check data)."""

SCRATCH_INODE = 1 << 40  # chunks of inodes from here up are the fuzzer's to change
SCRATCH_DIR = "/fuzz-scratch"
CHECK_DIR = "/fuzz-check"
CHECK_PATH = CHECK_DIR + "/check.bin"
CHECK_SIZE = 6 * 1024 * 1024 + 12345
CHECK_CACHE = CHECK_DIR + "/kv"  # a KV cache with one block that must survive the run
CHECK_KEY = b"fuzz-check-block"
SCRATCH_CACHE = SCRATCH_DIR + "/kv"  # a KV cache the fuzzer may change
KV_BLOCK = 64 * 1024
