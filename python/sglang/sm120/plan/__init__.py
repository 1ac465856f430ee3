"""`python -m sglang.sm120 plan`: what upstream alone and the fork would capture on a card, from
upstream's own server-argument resolution with the card's facts faked (no GPU needed).

cards.py: the cards and the faked device probes; models.py: built-in model configs;
resolve.py: the two resolutions side by side; graph_memory.py: the fitted graph-memory estimate;
cli.py: the command.
"""
