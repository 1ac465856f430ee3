"""Fixed texts: calibration input for the NVFP4 scales, and the evaluation prompts that both the
CPU error estimate (factory) and the GPU serving tests use, so their numbers are comparable."""

CALIBRATION_TEXTS = (
    "The server started, loaded the weights and printed that it was ready to serve requests.",
    "Please explain why the sky looks blue during the day and red at sunset.",
    "Numbers like 12, 345 and 6789 appear in tables, prices and dates such as 2024-05-17.",
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "Mixture of experts layers route every token to a few experts chosen by a small gate.",
    "Good software is tested, documented and measured before it is shipped to users.",
)
CALIBRATION_RANDOM_SEQS = 4      # plus this many sequences of uniformly random token ids
CALIBRATION_RANDOM_LEN = 64

# Teacher-forced agreement sequences (bf16 vs NVFP4): each is scored at every position.
EVAL_TEXTS = (
    "The capital city of France is Paris, and the capital of Italy is Rome. Both cities are old.",
    "List three colors: red, green and blue. Now list three animals: a cat, a horse and an owl.",
    "Engineers measure latency in milliseconds and throughput in tokens per second on every build.",
    "Once upon a time a curious robot walked through the old library looking for a map of the sea.",
    "Water boils at 100 degrees Celsius at sea level; at 2024 meters it boils a little earlier.",
    "<|im_start|>user\nWrite a short letter to a friend about the mountains.<|im_end|>\n<|im_start|>assistant\n",
)

# Generation prompts for the serving tests.
GENERATE_PROMPTS = (
    "The capital city of France is",
    "List three colors: red, green and",
    "Once upon a time a curious robot",
)
