#!/usr/bin/env python3
"""Independent reference of gpu/data/order.hpp's epoch shuffle.

Usage: data_order_reference.py N SEED EPOCH [RANK WORLD]
Prints the order (or rank RANK of WORLD's share of it) as one JSON array.
data_tests compares it with epoch_order / rank_order: the shuffle must be the
same on every platform, so it is specified by this arithmetic, not by a
library's distribution.
"""
import json
import sys

M64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


def mix(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def rotl(x, k):
    return ((x << k) | (x >> (64 - k))) & M64


class Xoshiro256ss:
    def __init__(self, seed):
        self.s = []
        x = seed
        for _ in range(4):
            x = (x + GOLDEN) & M64
            self.s.append(mix(x))

    def next(self):
        s = self.s
        result = (rotl((s[1] * 5) & M64, 7) * 9) & M64
        t = (s[1] << 17) & M64
        s[2] ^= s[0]
        s[3] ^= s[1]
        s[1] ^= s[2]
        s[0] ^= s[3]
        s[2] ^= t
        s[3] = rotl(s[3], 45)
        return result

    def below(self, n):
        m = self.next() * n
        low = m & M64
        if low < n:
            threshold = ((1 << 64) - n) % n
            while low < threshold:
                m = self.next() * n
                low = m & M64
        return m >> 64


def epoch_order(n, seed, epoch):
    order = list(range(n))
    gen = Xoshiro256ss(seed ^ mix((epoch + GOLDEN) & M64))
    for i in range(n - 1, 0, -1):
        j = gen.below(i + 1)
        order[i], order[j] = order[j], order[i]
    return order


def main():
    n, seed, epoch = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    order = epoch_order(n, seed & M64, epoch & M64)
    if len(sys.argv) > 4:
        rank, world = int(sys.argv[4]), int(sys.argv[5])
        order = order[rank::world]
    print(json.dumps(order))


if __name__ == "__main__":
    main()
