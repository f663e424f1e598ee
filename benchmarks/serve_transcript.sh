#!/usr/bin/env bash
# curl transcripts against a running `verispec serve` (PORT, MODEL env): health, a completion, a streamed
# chat completion, three bad requests, and the speculative counters of /metrics.
H='Content-Type: application/json'
M=${MODEL:-qwen2.5-coder-1.5b-instruct}
echo "$ curl -s localhost:${PORT:-8000}/health"; curl -s localhost:${PORT:-8000}/health; echo
echo "\$ curl -s localhost:${PORT:-8000}/v1/completions -H '$H' -d '{\"model\": \"$M\", \"prompt\": \"def quicksort(arr):\", \"max_tokens\": 48, \"temperature\": 0}'"
curl -s localhost:${PORT:-8000}/v1/completions -H "$H" -d "{\"model\": \"$M\", \"prompt\": \"def quicksort(arr):\", \"max_tokens\": 48, \"temperature\": 0}"; echo
echo "\$ curl -sN localhost:${PORT:-8000}/v1/chat/completions -H '$H' -d '{\"model\": \"$M\", \"messages\": [{\"role\": \"user\", \"content\": \"Write a Python function that reverses a string.\"}], \"max_tokens\": 24, \"temperature\": 0, \"stream\": true, \"stream_options\": {\"include_usage\": true}}'"
curl -sN localhost:${PORT:-8000}/v1/chat/completions -H "$H" -d "{\"model\": \"$M\", \"messages\": [{\"role\": \"user\", \"content\": \"Write a Python function that reverses a string.\"}], \"max_tokens\": 24, \"temperature\": 0, \"stream\": true, \"stream_options\": {\"include_usage\": true}}"
echo "\$ curl -s -w ' HTTP %{http_code}' localhost:${PORT:-8000}/v1/completions -H '$H' -d '{\"model\": \"$M\", \"prompt\": \"hi\", \"temperature\": 2.5}'"
curl -s -w ' HTTP %{http_code}' localhost:${PORT:-8000}/v1/completions -H "$H" -d "{\"model\": \"$M\", \"prompt\": \"hi\", \"temperature\": 2.5}"; echo
echo "\$ curl -s -w ' HTTP %{http_code}' localhost:${PORT:-8000}/v1/completions -H '$H' -d '{\"model\": \"$M\", \"prompt\": \"hi\", \"max_tokens\": \"8\"}'"
curl -s -w ' HTTP %{http_code}' localhost:${PORT:-8000}/v1/completions -H "$H" -d "{\"model\": \"$M\", \"prompt\": \"hi\", \"max_tokens\": \"8\"}"; echo
echo "\$ curl -s -w ' HTTP %{http_code}' localhost:${PORT:-8000}/v1/completions -H '$H' -d '{\"prompt\": \"hi\",'"
curl -s -w ' HTTP %{http_code}' localhost:${PORT:-8000}/v1/completions -H "$H" -d '{"prompt": "hi",'; echo
echo '$ curl -s localhost:'"${PORT:-8000}"'/metrics | grep -v "^#" | grep -v _created | grep -E "spec_decode|time_to_first_token_seconds_(count|sum)|time_per_output_token_seconds_(count|sum)|e2e_request_latency_seconds_(count|sum)|target_forward|requests_total"'
curl -s localhost:${PORT:-8000}/metrics | grep -v "^#" | grep -v _created | grep -E "spec_decode|time_to_first_token_seconds_(count|sum)|time_per_output_token_seconds_(count|sum)|e2e_request_latency_seconds_(count|sum)|target_forward|requests_total"
