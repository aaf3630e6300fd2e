"""The networks the lessons train, and Awkward, the tests' and graders' model. Small on
purpose: they must train on a 2-core laptop."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    """The classic MNIST convnet of the old gloo DDP example (21,840 parameters).

    Two convolutions with dropout, then 320-50-10 fully connected; log-probabilities out,
    so the loss is F.nll_loss.
    """

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.conv2_drop = nn.Dropout2d()
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = x.flatten(1)  # (N, 320); the example's x.view(-1, 320) hides a wrong input size
        x = F.relu(self.fc1(x))
        x = F.dropout(x, training=self.training)
        return F.log_softmax(self.fc2(x), dim=1)


class BigNet(nn.Module):
    """The pytorch/examples MNIST convnet (1,199,882 parameters): enough gradient bytes
    (4.8 MB) for communication to matter next to computation."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = self.dropout1(x).flatten(1)
        x = self.dropout2(F.relu(self.fc1(x)))
        return F.log_softmax(self.fc2(x), dim=1)


class MLP(nn.Module):
    """A small fully connected net for fast tests: 28x28 images in, log-probabilities out."""

    def __init__(self, hidden=32, classes=10, in_features=784):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden)
        self.fc2 = nn.Linear(hidden, classes)

    def forward(self, x):
        return F.log_softmax(self.fc2(F.relu(self.fc1(x.flatten(1)))), dim=1)


class Awkward(nn.Module):
    """A test model with every case a gradient synchronizer must get right: a frozen weight
    (its bias still trains), a layer never called in forward (.grad stays None), one weight
    tied between two layers (one Parameter, two uses: its .grad already sums both), and a
    buffer (not a gradient). 11 parameters, of which 8 get a gradient; log-probabilities out.

    Awkward(784, 10) takes MNIST-shaped images (flattened); the default takes 20 features.
    """

    def __init__(self, inputs=20, classes=5):
        super().__init__()
        self.inp = nn.Linear(inputs, 12)
        self.frozen = nn.Linear(12, 12)
        self.frozen.weight.requires_grad_(False)
        self.a, self.b = nn.Linear(12, 12), nn.Linear(12, 12)
        self.b.weight = self.a.weight
        self.unused = nn.Linear(12, classes)
        self.head = nn.Linear(12, classes)
        self.register_buffer("running", torch.zeros(12))

    def forward(self, x):
        h = torch.tanh(self.inp(x.flatten(1)))
        h = torch.tanh(self.b(torch.tanh(self.a(self.frozen(h)))))
        return F.log_softmax(self.head(h), dim=1)


def init_weights(module):
    """Weight init the survey's way, through model.apply(init_weights), with torchvision's
    VGG recipe: Kaiming-normal conv weights (fan_out, suits ReLU), small normal(0, 0.01)
    linear weights, zero biases. Small last-layer weights start the loss near log(10) = 2.30,
    as a 10-class guess should; Kaiming's ReLU gain on the output layer starts it at 6-9."""
    if isinstance(module, nn.Conv2d):
        nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
        nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, 0.0, 0.01)
        nn.init.zeros_(module.bias)


def count_parameters(model):
    return sum(p.numel() for p in model.parameters())


MODELS = {"net": Net, "bignet": BigNet, "mlp": MLP}
