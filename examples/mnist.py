"""PyTorch's MNIST example (pytorch/examples, mnist/main.py), ported to lamina by
changing its imports and nothing else.

The data set is a synthetic stand-in of MNIST's shape (1x28x28 images, 10 classes,
each class a fixed random pattern plus noise), made here so that the example needs no
download. To run the same file on PyTorch, swap the import block for the one in the
comment below it.
"""

import argparse

import lamina as torch
import lamina.nn as nn
import lamina.nn.functional as F
import lamina.optim as optim
from lamina.optim.lr_scheduler import StepLR
from lamina.utils.data import DataLoader, TensorDataset

# import torch
# import torch.nn as nn
# import torch.nn.functional as F
# import torch.optim as optim
# from torch.optim.lr_scheduler import StepLR
# from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = self.conv1(x)
        x = F.relu(x)
        x = self.conv2(x)
        x = F.relu(x)
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = self.fc1(x)
        x = F.relu(x)
        x = self.dropout2(x)
        x = self.fc2(x)
        output = F.log_softmax(x, dim=1)
        return output


def train(args, model, device, train_loader, optimizer, epoch):
    model.train()
    for batch_idx, (data, target) in enumerate(train_loader):
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()
        if batch_idx % args.log_interval == 0:
            seen, total = batch_idx * len(data), len(train_loader.dataset)
            done = 100.0 * batch_idx / len(train_loader)
            print(f"Train Epoch: {epoch} [{seen}/{total} ({done:.0f}%)]\tLoss: {loss.item():.6f}")
            if args.dry_run:
                break


def test(model, device, test_loader):
    model.eval()
    test_loss = 0
    correct = 0
    with torch.no_grad():
        for data, target in test_loader:
            data, target = data.to(device), target.to(device)
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction="sum").item()  # sum up batch loss
            pred = output.argmax(dim=1, keepdim=True)  # get the index of the max log-probability
            correct += pred.eq(target.view_as(pred)).sum().item()

    test_loss /= len(test_loader.dataset)

    total = len(test_loader.dataset)
    print(
        f"\nTest set: Average loss: {test_loss:.4f}, "
        f"Accuracy: {correct}/{total} ({100.0 * correct / total:.0f}%)\n"
    )
    return correct / len(test_loader.dataset)


def synthetic_mnist(n, generator):
    """n images of MNIST's shape: class k is pattern k plus noise."""
    patterns = torch.rand(10, 1, 28, 28, generator=torch.Generator().manual_seed(1234))
    target = torch.randint(0, 10, (n,), generator=generator)
    noise = torch.randn(n, 1, 28, 28, generator=generator)
    data = (patterns[target] + 0.5 * noise - 0.1307) / 0.3081
    return TensorDataset(data, target)


def main():
    parser = argparse.ArgumentParser(description="MNIST Example")
    parser.add_argument("--batch-size", type=int, default=64, metavar="N")
    parser.add_argument("--test-batch-size", type=int, default=1000, metavar="N")
    parser.add_argument("--epochs", type=int, default=14, metavar="N")
    parser.add_argument("--lr", type=float, default=1.0, metavar="LR")
    parser.add_argument("--gamma", type=float, default=0.7, metavar="M")
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--seed", type=int, default=1, metavar="S")
    parser.add_argument("--log-interval", type=int, default=10, metavar="N")
    parser.add_argument("--train-size", type=int, default=60000, metavar="N")
    parser.add_argument("--test-size", type=int, default=10000, metavar="N")
    parser.add_argument("--save-model", default="", metavar="PATH")
    args = parser.parse_args()

    use_cuda = torch.cuda.is_available()
    torch.manual_seed(args.seed)
    device = torch.device("cuda" if use_cuda else "cpu")

    g = torch.Generator().manual_seed(args.seed)
    train_kwargs = {"batch_size": args.batch_size, "shuffle": True, "generator": g}
    test_kwargs = {"batch_size": args.test_batch_size}
    train_loader = DataLoader(synthetic_mnist(args.train_size, g), **train_kwargs)
    test_loader = DataLoader(synthetic_mnist(args.test_size, g), **test_kwargs)

    model = Net().to(device)
    optimizer = optim.Adadelta(model.parameters(), lr=args.lr)

    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
    for epoch in range(1, args.epochs + 1):
        train(args, model, device, train_loader, optimizer, epoch)
        accuracy = test(model, device, test_loader)
        scheduler.step()

    if args.save_model:
        torch.save(
            {"model": model.state_dict(), "optimizer": optimizer.state_dict()}, args.save_model
        )
        checkpoint = torch.load(args.save_model)
        restored = Net()
        restored.load_state_dict(checkpoint["model"])
        optimizer = optim.Adadelta(restored.parameters(), lr=args.lr)
        optimizer.load_state_dict(checkpoint["optimizer"])
        print(f"reloaded; accuracy {test(restored, device, test_loader):.3f}")
    print(f"final accuracy {accuracy:.3f}")


if __name__ == "__main__":
    main()
