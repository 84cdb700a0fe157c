"""Thin adapters onto existing distributed engines: transformers' tensor parallelism under
torch's launcher (tensor_parallel.py) and Ray Data for many prompts (ray_batch.py). No
scheduler, RPC layer or process pool of fptrace's own."""
