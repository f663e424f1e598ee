"""Variants of the kernel sources: the OpenMP worker reads the start of its half of the next matmul ahead."""
import shutil, sys
from pathlib import Path
src = Path(__file__).resolve().parents[3] / "verispec" / "models" / "kernels"
def make(name, kb):
    d = Path("/tmp/pf") / name
    if d.exists(): shutil.rmtree(d)
    shutil.copytree(src, d)
    if kb is None: return
    ops = (d / "ops.h").read_text()
    old = "  int64_t N = 0, K = 0;\n  int bits = 4;\n};"
    new = ("  int64_t N = 0, K = 0;\n  int bits = 4;\n"
           "  const Linear* next = nullptr;  // the matmul after this one in a layer stack: the worker reads its start ahead\n"
           "  bool ahead = false;            // some matmul before this one read the start of the worker's half ahead\n};")
    assert ops.count(old) == 1; (d / "ops.h").write_text(ops.replace(old, new))
    w = (d / "w4a8.cpp").read_text()
    old = """  at::parallel_for(0, NB, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t nb = b0; nb < b1; ++nb) {"""
    new = f"""  const bool two = at::get_num_threads() == 2 && NB >= 8 && M <= 16;
  const int64_t cut = worker_start(L);
  at::parallel_for(0, two ? 2 : NB, 1, [&](int64_t i0, int64_t i1) {{
    const int64_t b0 = two ? (i0 == 0 ? 0 : cut) : i0, b1 = two ? (i1 == 1 ? cut : NB) : i1;
    if (two && i0 == 1 && L.next) read_ahead(*L.next);
    for (int64_t nb = b0; nb < b1; ++nb) {{"""
    assert w.count(old) == 1; w = w.replace(old, new)
    helper = f"""
constexpr int64_t kAheadBytes = {kb} * 1024;
int64_t ahead_blocks(const Linear& L) {{
  const int64_t NB = L.N / 16, per = L.K * L.bits * 2 + L.K;  // weights and group codes of 16 columns
  return std::min<int64_t>(kAheadBytes / per, NB / 4);
}}
// The worker's half starts early enough that both finish together when its first ahead_blocks are already in L2.
int64_t worker_start(const Linear& L) {{
  const int64_t NB = L.N / 16;
  return L.ahead ? (NB - ahead_blocks(L) + 1) / 2 : (NB + 1) / 2;
}}
void read_ahead(const Linear& L) {{
  const int64_t nb0 = worker_start(L), n = ahead_blocks(L), G = L.K / 32;
  const char* w = reinterpret_cast<const char*>(L.w + nb0 * L.K * L.bits * 2);
  for (int64_t i = 0; i < n * L.K * L.bits * 2; i += 64) _mm_prefetch(w + i, _MM_HINT_T1);
  const char* c = reinterpret_cast<const char*>(L.codes + nb0 * G * 32);
  for (int64_t i = 0; i < n * G * 32; i += 64) _mm_prefetch(c + i, _MM_HINT_T1);
}}

void mm_into("""
    assert w.count("\nvoid mm_into(") == 1; w = w.replace("\nvoid mm_into(", helper, 1)
    (d / "w4a8.cpp").write_text(w)
    l = (d / "layer.cpp").read_text()
    old = "  s->tensors = std::move(tensors);\n  return s;"
    new = """  for (size_t i = 0; i < s->ops.size(); ++i) {  // each matmul's successor within the stack, set once the vector stays
    LayerOps& o = s->ops[i];
    o.qkv.next = &o.o;
    o.o.next = &o.w13;
    o.w13.next = &o.w2;
    o.w2.next = i + 1 < s->ops.size() ? &s->ops[i + 1].qkv : nullptr;
    o.o.ahead = o.w13.ahead = o.w2.ahead = true;
    o.qkv.ahead = i > 0;
  }
  s->tensors = std::move(tensors);
  return s;"""
    assert l.count(old) == 1; (d / "layer.cpp").write_text(l.replace(old, new))
make("base", None)
for kb in (32, 96, 192):
    make(f"pf{kb}", kb)
