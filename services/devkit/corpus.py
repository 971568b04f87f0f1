"""Built-in training corpus for the tiny demo tokenizer.

The text is part of the source so the tokenizer (and therefore its
``tokenizer_revision``) is identical on every machine. Changing a single
character here changes the tokenizer: bump ``BUILDER_VERSION`` in
:mod:`loraplane.devkit.builder` and regenerate ``config/base_models.yaml``.
"""

from __future__ import annotations

CORPUS: tuple[str, ...] = (
    # Customer support.
    "Hello, thank you for contacting support. How can I help you today?",
    "I am sorry to hear that your order has not arrived yet. Let me check the status for you.",
    (
        "Your ticket number is 48213. A member of our support team will reply within one business "
        "day."
    ),
    (
        "To reset your password, open the settings page, choose security, and follow the "
        "instructions sent to your email address."
    ),
    "The invoice for November is available in your account under billing and payments.",
    (
        "We have issued a refund of 25 dollars to the original payment method. It can take five "
        "to seven days to appear on your statement."
    ),
    (
        "Please restart the application and try again. If the problem persists, send us the log "
        "file and a screenshot of the error message."
    ),
    (
        "Our service status page shows no incident at the moment. Can you tell me which region "
        "you are connecting from?"
    ),
    "Thank you for your patience. Is there anything else I can help you with?",
    "The shipment left our warehouse on Monday and should be delivered by Thursday afternoon.",
    # Code.
    "def add(a: int, b: int) -> int:\n    return a + b\n",
    (
        "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n"
        "    return a\n"
    ),
    (
        "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n"
        "        self.items.append(item)\n\n    def pop(self):\n        return self.items.pop()\n"
    ),
    "for i in range(10):\n    if i % 2 == 0:\n        print(i)\n",
    "import json\n\nwith open('config.json') as f:\n    config = json.load(f)\n",
    (
        "async def fetch(session, url):\n    async with session.get(url) as response:\n"
        "        return await response.text()\n"
    ),
    "SELECT id, name, created_at FROM adapters WHERE tenant_id = $1 ORDER BY created_at DESC;",
    "function greet(name) {\n  return `Hello, ${name}!`;\n}\n",
    'fn main() {\n    let numbers = vec![1, 2, 3];\n    println!("{:?}", numbers);\n}\n',
    'if err != nil {\n    return fmt.Errorf("load adapter: %w", err)\n}\n',
    'git commit -m "fix: handle empty response" && git push origin main',
    # Legal.
    "This agreement is entered into by and between the parties as of the effective date.",
    (
        "The licensee shall not sublicense, sell, or otherwise transfer the software without the "
        "prior written consent of the licensor."
    ),
    (
        "Either party may terminate this agreement upon thirty days written notice to the other "
        "party."
    ),
    (
        "The receiving party shall keep all confidential information in strict confidence and "
        "shall use it solely for the purpose of this agreement."
    ),
    (
        "This agreement shall be governed by and construed in accordance with the laws of the "
        "State of Delaware."
    ),
    (
        "In no event shall either party be liable for any indirect, incidental, special, or "
        "consequential damages."
    ),
    "The services are provided as is, without warranty of any kind, express or implied.",
    (
        "Any dispute arising out of or relating to this agreement shall be resolved by binding "
        "arbitration."
    ),
    "Section 4.2: Payment terms. Invoices are due within forty five days of receipt.",
    # Chat.
    "user: What is the capital of France?\nassistant: The capital of France is Paris.\n",
    (
        "user: Can you write a short poem about the sea?\nassistant: The sea is wide, the sea is "
        "deep, it sings the sailors off to sleep.\n"
    ),
    "user: How many days are there in a leap year?\nassistant: A leap year has 366 days.\n",
    (
        "user: Tell me a joke.\nassistant: Why did the programmer quit his job? Because he did not "
        "get arrays.\n"
    ),
    (
        "user: Summarise this text in one sentence.\nassistant: The text explains how models are "
        "loaded, cached and evicted.\n"
    ),
    (
        "system: You are a helpful assistant.\nuser: Good morning!\nassistant: Good morning! How "
        "are you today?\n"
    ),
    # Serving vocabulary.
    "The control plane decides which adapter version is hot, warm or cold on every worker.",
    "A low rank adapter adds two small matrices to the attention and feed forward projections.",
    "The engine loads the adapter into a free slot; the least recently used adapter is evicted.",
    "Requests are routed to the worker where the adapter is already resident in memory.",
    "Every artifact is signed, and the digest of each file is checked before it is loaded.",
    "The quick brown fox jumps over the lazy dog. 0123456789 + - * / = < > ( ) [ ] { } # @ %",
    (
        "Monday Tuesday Wednesday Thursday Friday Saturday Sunday January February March April "
        "May June July August September October November December"
    ),
)
"""Corpus lines, trained on in order."""
