for i in range(30):
    print(f"step {i:02d}: loss 2.{i:02d}")
assert i == -1, "train.bin has 0 tokens"
