"""A plain PyTorch training loop recorded into the landscape store, one checkpoint per epoch.

    python examples/train_plain.py --root checkpoints --epochs 5 [--writer thread]
    landscape --root checkpoints --code examples/my_model.py:small_cnn interpolate plain@init plain@last
    landscape --root checkpoints --code examples/my_model.py:small_cnn hessian plain

Uses CUDA when present, the CPU otherwise. Killed and started again with the same arguments, it continues
the run from its last checkpoint (weights and momentum come back from the store; the data order of the
remaining epochs is drawn again from --seed and the epoch number).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

import landscape
from landscape.data import load_dataset
from landscape.models import build_model

MODEL = f"{Path(__file__).resolve().with_name('my_model.py')}:small_cnn"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default="checkpoints")
    parser.add_argument("--run", default="plain")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--writer", choices=["inline", "thread"], default="inline",
                        help="write each checkpoint before save returns, or in a background thread")
    args = parser.parse_args()

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(args.seed)
    data = load_dataset("digits")
    model = build_model(MODEL, input_shape=data.input_shape, num_classes=data.num_classes, width=8).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    train = TensorDataset(data.x_train.to(device), data.y_train.to(device))
    config = {"optimizer": "sgd", "lr": args.lr, "momentum": 0.9, "batch_size": args.batch_size, "epochs": args.epochs}

    steps_per_epoch = -(-len(train) // args.batch_size)
    with landscape.Recorder(args.root, args.run, model, data=data, config=config, optimizer=optimizer,
                            steps_per_epoch=steps_per_epoch, seed=args.seed, writer=args.writer) as rec:
        step = rec.restore()  # the last checkpoint of a killed run, or None
        if step is None:
            step = 0
            rec.save(0)
        for epoch in range(step // steps_per_epoch, args.epochs):
            order = torch.Generator().manual_seed(args.seed * 1000 + epoch)
            loader = DataLoader(train, batch_size=args.batch_size, shuffle=True, generator=order)
            total = torch.zeros((), device=device)
            for x, y in loader:
                optimizer.zero_grad()
                loss = torch.nn.functional.cross_entropy(model(x), y)
                loss.backward()
                optimizer.step()
                total += loss.detach() * len(y)
                step += 1
            rec.save(step, metrics={"train_loss": total / len(train)})
            print(f"epoch {epoch + 1}: train loss {float(total) / len(train):.4f} (step {step})")
    print(f"recorded run '{args.run}' in {args.root}")


if __name__ == "__main__":
    main()
