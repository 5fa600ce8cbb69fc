# Ordinary data-analysis cells the strict policy must let through.
# One cell per block; blocks are separated by a line holding only `# ---`. Add to it freely.
import pandas as pd
df = pd.DataFrame({'open': [1.0, 2.5], 'close': [1.5, 2.0]})
df['change'] = df['close'] - df.open
print(df.describe())
# ---
import math, statistics
values = [3, 1, 4, 1, 5, 9, 2, 6]
print(statistics.mean(values), math.sqrt(sum(v * v for v in values)))
# ---
name = 'world'
print(f'hello {name}!\n', 'tab\there', "quote \" and \\ backslash")
# ---
print('{:.2f} and {:>8}'.format(3.14159, 'right'))
# ---
print('{0} {1} {0}'.format('a', 'b'), '{name}'.format(name='x'))
# ---
print('{items[0]}'.format(items=[1, 2]))
# ---
import json
data = json.loads('{"a": [1, 2, {"b": null}]}')
print(json.dumps(data, indent=2))
# ---
from collections import Counter, defaultdict
words = 'the cat sat on the mat'.split()
counts = Counter(words)
groups = defaultdict(list)
for w in words:
    groups[len(w)].append(w)
print(counts.most_common(2), dict(groups))
# ---
class Account:
    def __init__(self, owner, balance=0):
        self.owner = owner
        self.balance = balance

    def deposit(self, amount):
        self.balance += amount
        return self.balance

acct = Account('ann')
acct.deposit(10)
print(acct.owner, acct.balance)
# ---
from dataclasses import dataclass, field

@dataclass
class Order:
    item: str
    qty: int = 1
    tags: list = field(default_factory=list)

orders = [Order('pen', 3), Order('ink')]
print(sorted(orders, key=lambda o: o.qty))
# ---
import re
text = 'Order #123 shipped on 2026-11-30'
print(re.findall(r'\d+', text), re.sub(r'\s+', ' ', '  a   b '))
# ---
import datetime
d = datetime.date(2026, 11, 30)
print(d.isoformat(), (d - datetime.date(2026, 1, 1)).days)
# ---
matrix = [[1, 2], [3, 4]]
transposed = [list(row) for row in zip(*matrix)]
print(transposed, sum(map(sum, matrix)))
# ---
async def fetch(x):
    return x * 2

results = [await fetch(i) for i in range(3)]
print(results)
# ---
try:
    1 / 0
except ZeroDivisionError as error:
    print('caught', type(error).__name__)
# ---
import itertools
pairs = list(itertools.combinations('abc', 2))
print(pairs, b'\x00\xff'.hex(), '\N{GREEK SMALL LETTER ALPHA}')
# ---
sales = {'north': 120, 'south': 80}
best = max(sales, key=sales.get)
print(best, sorted(sales.items(), key=lambda kv: -kv[1]))
# ---
import numpy as np
a = np.arange(12).reshape(3, 4)
print(a.mean(axis=0), a.T.shape)
# ---
text = """a multi-line
string with 'quotes' and {braces}"""
print(text.upper().count('S'))
# ---
print(hasattr([], 'append'), getattr(3, 'real'), getattr(complex(1, 2), 'imag'))
