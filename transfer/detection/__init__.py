"""Transfer to COCO detection, instance segmentation and keypoints with detectron2.

A detectron2 project in the style of detectron2's ``projects/TridentNet``: the configs in
``configs/coco_*_rcnn_*.yaml`` are plain detectron2 YAML (no custom keys, nothing registered), so
importing this package changes nothing in detectron2. Modules:

* :mod:`.convert`: torchvision/LORAC/MoCo ResNet checkpoints -> detectron2 weights files.
* :mod:`.config`: strict config loading with errors naming the key and file.
* :mod:`.datasets`: COCO 2017 via ``$DETECTRON2_DATASETS`` and user COCO-format registration.
* :mod:`.weights`: check that a weights file fits the built model.
* :mod:`.trainer`: ``DetectionTrainer`` (detectron2 ``DefaultTrainer``) and the script body.
* :mod:`.results`: Table 4-shaped Markdown/CSV from finished runs.

Submodules are imported where used (nothing here), so ``tools/collect_detection_results.py``
starts without torch and ``tools/convert_to_d2.py`` without detectron2.
"""
