"""How long the fuzzer waits for the servers.

Read as ``timeouts.NAME`` when used, so that a test may lengthen them.
"""

ANSWER_TIMEOUT = 5.0  # an input's answer (or the server closing)
CALL_TIMEOUT = 10.0  # a gRPC call or an HTTP request
SLOW_TIMEOUT = 120.0  # fsck over HTTP
PROBE_TIMEOUT = 5.0
PROBE_INTERVAL = 1.0
FRAME_TIMEOUT = 3.0  # the storage servers' --frame-timeout in the fuzzed cluster
STALL_SLACK = 4.0  # how much later than its frame timeout a stalled frame may be dropped
