"""Constants defined once for the whole project."""

# torchvision's ImageNet statistics, in RGB order and in [0, 1] units. Pretraining normalises with
# these; the detectron2 configs and the classification tools derive their values from here.
IMAGENET_MEAN_RGB: tuple[float, float, float] = (0.485, 0.456, 0.406)
IMAGENET_STD_RGB: tuple[float, float, float] = (0.229, 0.224, 0.225)

# The same in 0-255 units (detectron2's MODEL.PIXEL_MEAN / PIXEL_STD with INPUT.FORMAT "RGB").
IMAGENET_MEAN_255: tuple[float, float, float] = tuple(round(255 * m, 3) for m in IMAGENET_MEAN_RGB)
IMAGENET_STD_255: tuple[float, float, float] = tuple(round(255 * s, 3) for s in IMAGENET_STD_RGB)
