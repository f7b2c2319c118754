"""The request pipeline, the same in every process layout: admit, decode, preprocess, infer, answer."""
