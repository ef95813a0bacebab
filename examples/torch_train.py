"""A plain PyTorch training script; the one line marked below hands the model's forward and backward to onnxtrain.

    python examples/torch_train.py [EPOCHS]

Trains a small classifier (conv, BatchNorm, ReLU, pooling, linear) on synthetic 8x8 images of horizontal or
vertical stripes with torch.optim.AdamW, a DataLoader and gradient clipping, prints the mean loss of every epoch
and the accuracy of the eval-mode model on held-out data. Delete the marked line and it is an eager PyTorch script
(tests/python/test_torch_module_example.py runs both and compares what they print).
"""
import sys

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import onnxtrain.torch


def stripes(n, generator):
    labels = torch.randint(0, 2, (n,), generator=generator)
    phase = torch.randint(0, 2, (n, 1, 1), generator=generator)
    line = (torch.arange(8) + phase) % 2  # [n, 1, 8]: alternating stripes
    images = torch.where(labels[:, None, None] == 1, line.expand(n, 8, 8), line.transpose(1, 2).expand(n, 8, 8))
    images = images.float() + 0.3 * torch.randn(n, 8, 8, generator=generator)
    return images.unsqueeze(1), labels


def main(epochs):
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    train = TensorDataset(*stripes(256, gen))
    test_x, test_y = stripes(128, gen)
    loader = DataLoader(train, batch_size=32, shuffle=True, generator=torch.Generator().manual_seed(2))

    model = nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 2))
    model = onnxtrain.torch.TrainModule(model)  # the only onnxtrain line
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)

    for epoch in range(epochs):
        model.train()
        total, batches = 0.0, 0
        for x, y in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            optimizer.step()
            total, batches = total + loss.item(), batches + 1
        print(f"epoch {epoch + 1} loss {total / batches:.6f}")

    model.eval()
    with torch.no_grad():
        accuracy = (model(test_x).argmax(1) == test_y).float().mean().item()
    print(f"test accuracy {accuracy:.4f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
