"""llama.cpp greedy decoding for ``quicksilver bench llm``, in a Python that has it.

    python llamacpp_worker.py GGUF THREADS

llama-cpp-python is built separately (it compiles llama.cpp; docs/export.md says how),
often into its own virtual environment, so this file imports nothing of the project and
speaks JSON lines on stdin / stdout. It first prints ``{"ready": ..., "version": ...}``;
then for each request ``{"ids": [...], "n": N, "stop": [...], "keep": K}`` it prints one line
``{"t": id}`` per generated token as soon as llama.cpp has it (stop tokens are not
sent), then ``{"done": true, "passes": P, "stopped_by": "end" | "budget"}``. A reply
prefills its whole prompt (the cache is reset first), as the project's engines do in
the bench, unless ``keep`` > 0: then at most the cache's first K tokens are reused,
where the prompt starts with them (llama-cpp-python's own prefix match), as the
project's engines keep the system prompt's cache with ``--system-cached``.
"""

from __future__ import annotations

import json
import sys


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: llamacpp_worker.py GGUF THREADS", file=sys.stderr)
        return 2
    try:
        import llama_cpp
    except ImportError as exc:
        print(json.dumps({"error": f"cannot import llama_cpp: {exc}"}), flush=True)
        return 1
    gguf, threads = argv[0], int(argv[1])
    llm = llama_cpp.Llama(
        model_path=gguf,
        n_ctx=2048,
        n_threads=threads,
        n_threads_batch=threads,
        n_batch=512,
        verbose=False,
    )
    print(json.dumps({"ready": True, "version": llama_cpp.__version__}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        stop = set(request["stop"])
        keep = int(request.get("keep", 0))
        if keep > 0:  # generate() reuses the longest prefix of these it finds
            llm.n_tokens = min(llm.n_tokens, keep)
        else:  # no prefix reuse: a full prefill, like the engines it is timed against
            llm.reset()
        passes = 0
        end = "budget"
        tokens = llm.generate(
            request["ids"], top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0
        )
        # each token came out of one pass: the prefill, then one per token fed back
        for passes, token in enumerate(tokens, 1):
            if token in stop:
                end = "end"
                break
            print(json.dumps({"t": int(token)}), flush=True)
            if passes >= request["n"]:
                break
        print(json.dumps({"done": True, "passes": passes, "stopped_by": end}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
