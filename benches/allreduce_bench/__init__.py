"""The PyTorch all-reduce bench behind benches/pytorch_allreduce.py, by concern: `cli` (arguments
and the multicast check), `common` (helpers and the watchdog), `contenders` (the all-reduce
paths), `nccl_symmetric` (NCCL's symmetric kernels through ctypes), `timing` (the method),
`report` (table and JSON), `bench` (one run's set-up and loop) and `main` (torch, the process
group and the exit code). torch is imported only when `main` runs, so every module imports on a
machine without it."""
