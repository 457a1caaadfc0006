import pytest

import models


@pytest.mark.parametrize("name, shape", [
    ("digits_cnn", (8, 8, 1)), ("mnist_cnn", (28, 28, 1)), ("cifar_resnet20", (32, 32, 3)),
    ("resnet50v2", (32, 32, 3)), ("resnet152v2", (32, 32, 3))])
def test_models_output_logits_per_class(name, shape):
  model = models.build(name, shape, 7)
  assert model.output_shape == (None, 7)
  assert model.layers[-1].activation.__name__ == "linear"


def test_cifar_resnet20_has_about_a_quarter_million_parameters():
  assert 260_000 < models.build("cifar_resnet20", (32, 32, 3), 10).count_params() < 280_000


def test_unknown_model_lists_valid_names_and_suggests_one():
  with pytest.raises(LookupError, match=r"unknown model 'resnet50' \(did you mean 'resnet50v2'\?\); valid: mnist_cnn"):
    models.build("resnet50", (32, 32, 3), 10)


def test_applications_resnets_need_32_pixels():
  with pytest.raises(ValueError, match="at least 32x32.*set data.image_size"):
    models.build("resnet50v2", (8, 8, 1), 10)
