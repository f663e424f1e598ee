"""Prometheus metrics of one server, in a registry of its own (never the process-global default one).

Speculative counters follow vLLM's meaning: a *draft* is one round that proposed tokens; accepted tokens
per position count, for position i, the rounds in which draft i was accepted. So
alpha = accepted / draft tokens and mean accepted length = 1 + accepted / drafts (for rounds that drafted).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
_PER_TOKEN = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class ServerMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        p = "verispec_"
        self.drafts = Counter(p + "spec_decode_num_drafts", "Rounds in which tokens were drafted", registry=r)
        self.draft_tokens = Counter(p + "spec_decode_num_draft_tokens", "Tokens drafted", registry=r)
        self.accepted_tokens = Counter(p + "spec_decode_num_accepted_tokens", "Drafted tokens accepted", registry=r)
        self.accepted_per_pos = Counter(p + "spec_decode_num_accepted_tokens_per_pos",
                                        "Rounds in which the draft at this position was accepted", ["position"],
                                        registry=r)
        self.draft_failures = Counter(p + "spec_decode_draft_failures",
                                      "Requests whose draft failed; they continued target-only", registry=r)
        self.target_forwards = Counter(p + "target_forwards", "Batched decoding forwards of the target", registry=r)
        self.batched_sequences = Counter(p + "target_forward_sequences",
                                         "Sequences summed over decoding forwards (/ forwards = mean batch)",
                                         registry=r)
        self.speculation_off_rounds = Counter(p + "speculation_off_rounds",
                                              "Rounds run without drafting because the batch exceeded "
                                              "--speculate-max-batch", registry=r)
        self.prompt_tokens = Counter(p + "prompt_tokens", "Prompt tokens of admitted requests", registry=r)
        self.prefix_cache_hits = Counter(p + "prefix_cache_hits", "Prompts that began like a stored one",
                                         registry=r)
        self.prefix_cache_tokens = Counter(p + "prefix_cache_reused_tokens",
                                           "Prompt tokens restored from the prefix cache instead of prefilled",
                                           registry=r)
        self.prefix_cache_bytes = Gauge(p + "prefix_cache_bytes", "Bytes of keys/values the prefix cache holds",
                                        registry=r)
        self.generation_tokens = Counter(p + "generation_tokens", "Tokens generated", registry=r)
        self.requests = Counter(p + "requests", "Finished requests by outcome", ["finish_reason"], registry=r)
        self.running = Gauge(p + "num_requests_running", "Sequences in the batch", registry=r)
        self.waiting = Gauge(p + "num_requests_waiting", "Requests queued for a free batch row", registry=r)
        self.ttft = Histogram(p + "time_to_first_token_seconds", "Arrival to first token", buckets=_LATENCY,
                              registry=r)
        self.per_token = Histogram(p + "time_per_output_token_seconds",
                                   "Mean seconds per output token after the first, per request", buckets=_PER_TOKEN,
                                   registry=r)
        self.e2e = Histogram(p + "e2e_request_latency_seconds", "Arrival to last token", buckets=_LATENCY,
                             registry=r)
        # drift watch (verispec.server.drift), per strategy and route, over its sliding window of rounds
        self.drift_alpha = Gauge(p + "drift_alpha", "Acceptance rate over the window", ["strategy", "route"], registry=r)
        self.drift_baseline = Gauge(p + "drift_alpha_baseline", "The acceptance rate drift is judged against",
                                    ["strategy", "route"], registry=r)
        self.drift_ratio = Gauge(p + "drift_alpha_ratio", "Acceptance rate over the window / baseline",
                                 ["strategy", "route"], registry=r)
        self.drift_tokens_per_forward = Gauge(p + "drift_tokens_per_forward",
                                              "Tokens emitted per target forward over the window", ["strategy", "route"],
                                              registry=r)
        self.drift_fallback = Gauge(p + "drift_fallback", "1 while the strategy's rows decode plainly because "
                                    "speculation did not pay", ["strategy", "route"], registry=r)

    def record_round(self, drafted: int, accepted: int) -> None:
        if drafted:
            self.drafts.inc()
            self.draft_tokens.inc(drafted)
            self.accepted_tokens.inc(accepted)
            for i in range(accepted):
                self.accepted_per_pos.labels(position=str(i)).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
