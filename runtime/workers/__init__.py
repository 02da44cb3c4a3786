"""The processes of a parallel engine: `driver.ParallelModel` (in the engine's process: starts
the ranks, sends each step's batch, receives the logits) and `worker.main` (one rank: its
shard of the model and of the KV pool). They are joined by `torch.distributed` (gloo on CPU,
NCCL where CUDA is used)."""
