"""Transfer to COCO detection, instance segmentation and keypoints: a detectron2 project in the
style of ``projects/TridentNet``, whose ``configs/coco_*_rcnn_*.yaml`` are plain detectron2 YAML.
Nothing is imported here, so ``tools/collect_detection_results.py`` starts without torch and
``tools/convert_to_d2.py`` without detectron2.
"""
