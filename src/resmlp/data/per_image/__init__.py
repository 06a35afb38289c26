"""The per-image path: records decoded one image at a time in DataLoader workers, then timm's transform."""
