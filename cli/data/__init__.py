"""The data room: checks of the data a run reads against its flags and its
model, before anything is written to the model dir.

- `checks`: `--num_classes` against the records' labels.txt,
  `--labels_offset` against the classes and the model dir's record,
  `--image_size` against the net, and the data's channels against the
  channels the model was trained on. `checks.classes_and_image_size` runs
  them all and gives the classes and image size the net is built for.

The records' own format (feature keys, readable files, decodable images,
labels in range) is checked where they are opened, by the reader
(`datasets/record_checks.py`), so that a library user of
`datasets.get_dataset` gets the same one line as the scripts.
"""
