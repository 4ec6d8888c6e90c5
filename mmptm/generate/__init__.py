"""Generation: decoding algorithms (greedy, beam search, nucleus sampling) over a step
function, and the steppers that drive a model's generative objective."""
