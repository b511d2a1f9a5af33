"""Offline, with ``vllm.LLM``: a request carrying hermes-vllm's constraint writes only valid calls.

With the package installed, vLLM loads the logits processor by itself; ``sampling_options`` puts the
request's tools in its ``SamplingParams``, and the calls are read from the text with
``split_spans``. No server: run ``python examples/offline.py`` (it uses the model ``make demo``
trains, or ``EXAMPLE_MODEL_PATH``). Prints each call as one JSON line.
"""

import json
import os

from vllm import LLM, SamplingParams

from hermes_vllm import sampling_options
from hermes_vllm.demo.trained_model import trained_model_path
from hermes_vllm.spans import split_spans

MODEL_PATH = os.environ.get("EXAMPLE_MODEL_PATH") or str(trained_model_path())
DIALECT = "qwen"  # the model's own chat template: Qwen 3's <tool_call> spans, "name" first

TRIANGLE_AREA = {
    "type": "function",
    "function": {
        "name": "calculate_triangle_area",
        "description": "Calculate the area of a triangle given its base and height.",
        "parameters": {
            "type": "object",
            "properties": {"base": {"type": "integer"}, "height": {"type": "integer"}},
            "required": ["base", "height"],
        },
    },
}


def main() -> None:
    llm = LLM(MODEL_PATH, max_model_len=4096, kv_cache_memory_bytes=256 << 20, enforce_eager=True)
    options = sampling_options(llm.get_tokenizer(), [TRIANGLE_AREA], tool_choice="required", dialect=DIALECT)
    params = SamplingParams(temperature=0.0, max_tokens=100, **options)
    messages = [{"role": "user", "content": "Find the area of a triangle with a base of 10 and height of 5."}]
    text = llm.chat(messages, params, tools=[TRIANGLE_AREA], use_tqdm=False)[0].outputs[0].text
    print(f"model wrote: {text!r}")
    for span in split_spans(text, DIALECT):
        if span.kind == "call":
            print(json.dumps(json.loads(span.body)))


if __name__ == "__main__":
    main()
