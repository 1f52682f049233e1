"""The chat format: prompts from the tokenizer's chat template, as token ids."""

from meta_agent.episode.chat import ChatFormat


def test_prompt_uses_the_chat_template(tokenizer):
    chat = ChatFormat(tokenizer)
    prompt = chat.prompt([{"role": "user", "content": "What is 2+2?"}])
    text = tokenizer.decode(prompt)
    assert text.startswith("<|im_start|>system") and "What is 2+2?" in text
    assert text.endswith("<|im_start|>assistant\n")
    assert chat.decode_raw(chat.encode("<answer>4</answer>")) == "<answer>4</answer>"
