"""Speculative decoding: proposers guess tokens, one target forward verifies them.

`config.SpeculativeConfig` (the Engine keywords and server flags), `ngram.NgramProposer`
(lookup in the request's own prompt and output), `verify` (the acceptance rule: greedy or
rejection sampling, the grammar mask per position), `speculator.Speculator` (the scheduler's
hook: drafts through the request's grammar, adaptive draft length).
"""
