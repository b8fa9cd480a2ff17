"""A fixed list of voice-assistant questions for parity checks and benchmarks.

Short spoken questions of the kind the glasses, car and browser clients send; fixed so
that every run and every engine sees the same prompts.
"""

from __future__ import annotations

QUESTIONS: tuple[str, ...] = (
    "What is the capital of France?",
    "How far away is the moon?",
    "Can you tell me a fun fact about octopuses?",
    "What should I cook for dinner tonight?",
    "How do I boil an egg?",
    "Why is the sky blue?",
    "What's a good way to fall asleep faster?",
    "How many minutes are in a day?",
    "Give me a tip for staying focused at work.",
    "What is the tallest mountain in the world?",
    "How do plants make their food?",
    "What's the difference between weather and climate?",
    "Can you suggest a name for my new puppy?",
    "How long should I let bread dough rise?",
    "What is a good exercise I can do at my desk?",
    "Who wrote Romeo and Juliet?",
    "How do I keep my phone battery healthy?",
    "What is the speed of light?",
    "Tell me a short joke.",
    "How can I remember names better?",
    "What causes thunder?",
    "How do I say thank you in Spanish?",
    "What is photosynthesis in one sentence?",
    "How often should I water a cactus?",
)
