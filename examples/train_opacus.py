"""An Opacus DP-SGD loop recorded into the landscape store: weights, epsilon and the privacy settings.

    python examples/train_opacus.py --root checkpoints --epochs 5
    landscape --root checkpoints --code examples/my_model.py:small_cnn hessian opacus
    landscape --root checkpoints --code examples/my_model.py:small_cnn train --from opacus@last --optimizer dpsgd \
        --noise-multiplier 1.0 --run more

Each checkpoint's epsilon is the PrivacyEngine accountant's at --delta; the run's manifest holds the noise
multiplier, sample rate, clipping norm and accountant as `landscape train` writes them, so a run trained
`--from` it composes these steps into its own epsilon. Uses CUDA when present, the CPU otherwise; started
again after a kill, it continues from its last checkpoint with the accountant's history.
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

import torch
from opacus import PrivacyEngine
from torch.utils.data import DataLoader, TensorDataset

import landscape
from landscape.data import load_dataset
from landscape.integrations.opacus import OpacusPrivacy
from landscape.models import build_model

MODEL = f"{Path(__file__).resolve().with_name('my_model.py')}:small_cnn"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default="checkpoints")
    parser.add_argument("--run", default="opacus")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--noise-multiplier", type=float, default=1.0)
    parser.add_argument("--max-grad-norm", type=float, default=1.0)
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(args.seed)
    data = load_dataset("digits")
    model = build_model(MODEL, input_shape=data.input_shape, num_classes=data.num_classes, width=8).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    loader = DataLoader(TensorDataset(data.x_train, data.y_train), batch_size=args.batch_size,
                        generator=torch.Generator().manual_seed(args.seed))
    with warnings.catch_warnings():  # Opacus warns about secure RNG: this is an example, not a release
        warnings.simplefilter("ignore")
        engine = PrivacyEngine(accountant="rdp")
        model, optimizer, loader = engine.make_private(module=model, optimizer=optimizer, data_loader=loader,
                                                       noise_multiplier=args.noise_multiplier,
                                                       max_grad_norm=args.max_grad_norm)
    privacy = OpacusPrivacy(engine, optimizer, loader, delta=args.delta)
    config = {"optimizer": "dpsgd", "lr": args.lr, "batch_size": args.batch_size, "epochs": args.epochs,
              "noise_multiplier": args.noise_multiplier, "max_grad_norm": args.max_grad_norm}

    with landscape.Recorder(args.root, args.run, model, data=data, config=config, optimizer=optimizer,
                            privacy=privacy, steps_per_epoch=len(loader), seed=args.seed) as rec:
        step = rec.restore()  # weights, optimizer and the accountant's history of a killed run, or None
        if step is None:
            rec.save()  # step 0, epsilon 0
            step = 0
        for epoch in range(step // len(loader), args.epochs):
            total, seen = torch.zeros((), device=device), 0
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # Opacus' hook warning on inputs without grad
                for x, y in loader:
                    x, y = x.to(device), y.to(device)
                    optimizer.zero_grad()
                    loss = torch.nn.functional.cross_entropy(model(x), y)
                    loss.backward()
                    optimizer.step()
                    total += loss.detach() * len(y)
                    seen += len(y)
            rec.save(metrics={"train_loss": total / max(seen, 1)})  # step = the accountant's count
            print(f"epoch {epoch + 1}: train loss {float(total) / max(seen, 1):.4f}, "
                  f"epsilon {privacy.epsilon():.3f} at delta {args.delta:g}")
    print(f"recorded run '{args.run}' in {args.root}")


if __name__ == "__main__":
    main()
