"""Transfer to detection and segmentation (COCO boxes, masks and keypoints, Pascal VOC, LVIS,
Cityscapes instances; semantic segmentation with Semantic FPN and DeepLabV3+ on Cityscapes,
ADE20K and VOC12-aug): a detectron2 project in the style of ``projects/TridentNet``, whose
``configs/*.yaml`` are plain detectron2 YAML.
Nothing is imported here, so ``tools/collect_detection_results.py`` starts without torch and
``tools/convert_to_d2.py`` without detectron2.
"""
