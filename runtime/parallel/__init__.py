"""Splitting a model over ranks: which heads, vocabulary rows, layers and experts each rank
holds (`shard.py`), and the collectives the sharded forward needs (`comm.py`, over
`torch.distributed`; a no-op for one process). Used by the model files; the processes that
hold the shards are in `runtime/workers/`."""
